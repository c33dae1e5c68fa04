"""Hand-written normalization modules inside a .pt2 program: their aten ops grouped, read and proved.

An ExportedProgram keeps no modules, but every node names the modules that produced it
(`nn_module_stack`). For each module that is no stock normalization class but looks like one
(its class name contains "Norm", or it reads a 1-D `weight` and has no child modules), its nodes
are cut out (`traced_groups`), read by `norm_graph.derive` and run alone on a probe against the
NumPy reference; a proved spec replaces what the native-op reader made of the same module (it
misses ConvNeXt's permutation to channels-last, Gemma's `1 + w`), and a module that looks like a
normalization but is not proved is returned as unrecognised, with the reason.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Any

import torch

from schemas import NormSpec

from ..pt2.opaque_operators import is_opaque, operator_of
from ..torch_internals import op_name
from . import norm_proof
from .aten_calls import MODULE_KINDS, OP_KINDS, _Reader
from .data_flow import reads_a_parameter
from .inline_standardization import standardization_in
from .derived_spec import TORCH_OF, build_spec, to_torch
from .norm_graph import NotANormalization, derive, shape_of
from .norm_names import names_a_norm, says_no_norm
from .traced_groups import class_path_of, group_of, module_paths, runner, state_names, state_tensor


@dataclass(frozen=True)
class ProgramModule:
    """One module of a program that looks like a normalization: its spec when proved, else why not."""

    path: str
    module_type: str
    position: int
    why_candidate: str
    spec: NormSpec | None
    reason: str | None
    has_native_op: bool


_CACHE: "weakref.WeakKeyDictionary[Any, list[ProgramModule]]" = weakref.WeakKeyDictionary()


def program_modules(program: Any) -> list[ProgramModule]:
    """Every module of `program` that looks like a normalization no stock class covers, in graph order."""
    try:
        cached = _CACHE.get(program)
    except TypeError:
        cached = None
    if cached is not None:
        return cached
    groups = _groups(program)
    names = state_names(
        program
    )  # once: each read of the signature's mappings rebuilds them (1.8 ms per module of a decoder)
    keys, children = set(names.values()), _children(groups)
    found, candidates = [], set()
    for path, (type_name, position, nodes) in groups.items():
        why = _why(program, path, type_name, groups, children.get(path, ()), keys)
        if why is not None:
            candidates.add(path)
            module = _read(program, names, path, type_name, position, nodes, why)
            if module is not None:
                found.append(module)
    found += _inline_standardizations(program, names, groups, candidates)
    found.sort(key=lambda m: m.position)
    try:
        _CACHE[program] = found
    except TypeError:
        pass
    return found


def _inline_standardizations(
    program: Any, names: dict[str, str], groups: dict, candidates: set[str]
) -> list[ProgramModule]:
    """The modules no name rule made candidates whose own ops (not their children's) standardize a value
    (inline_standardization.py), the model's root included; not those inside a candidate or a stock class."""
    own: dict[str, tuple[str, int, list]] = {}
    for position, node in enumerate(program.graph.nodes):
        if node.op == "call_function":
            paths = module_paths(node)
            path, type_name = paths[-1] if paths else ("", "")
            own.setdefault(path, (type_name, position, []))[2].append(node)
    found = []
    for path, (type_name, position, nodes) in own.items():
        if _inside_a_norm(path, groups, candidates):
            continue
        why = standardization_in(program, nodes)
        if why is None:
            continue
        everything = groups[path][2] if path else [n for n in program.graph.nodes if n.op == "call_function"]
        module = _read(program, names, path or type_name or "(model)", type_name, position, everything, why)
        if module is not None and module.spec is None:  # a proved one is a normalization module; none is known to exist
            found.append(replace(module, has_native_op=any(op_name(n) in OP_KINDS for n in nodes)))
    return found


def _inside_a_norm(path: str, groups: dict, candidates: set[str]) -> bool:
    parts = path.split(".") if path else []
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in candidates or (prefix in groups and groups[prefix][0] in (*MODULE_KINDS, "SyncBatchNorm")):
            return True
    return False


def _groups(program: Any) -> dict[str, tuple[str, int, list]]:
    groups: dict[str, tuple[str, int, list]] = {}
    for position, node in enumerate(program.graph.nodes):
        if node.op != "call_function":
            continue
        for path, type_name in module_paths(node):
            if path:
                groups.setdefault(path, (type_name, position, []))[2].append(node)
    return groups


def _children(groups: dict) -> dict[str, list[str]]:
    """path -> the paths of the groups below it (any depth), each found from its own ancestors rather than by comparing
    every pair."""
    below: dict[str, list[str]] = {}
    for path in groups:
        parts = path.split(".")
        for end in range(1, len(parts)):
            below.setdefault(".".join(parts[:end]), []).append(path)
    return below


def _why(program: Any, path: str, type_name: str, groups: dict, children, keys: set[str]) -> str | None:
    """Why the module at `path` looks like a normalization (None: it does not); `children` are the groups below it,
    `keys` the program's state names."""
    if type_name in MODULE_KINDS or type_name == "SyncBatchNorm":
        return None  # the stock classes are read from their native op
    child_norm = any(groups[p][0] in MODULE_KINDS or names_a_norm(groups[p][0]) for p in children)
    if names_a_norm(type_name) and not child_norm:
        return f"its class name {type_name} contains 'Norm'"
    if (
        not children
        and f"{path}.weight" in keys
        and state_tensor(program, f"{path}.weight").dim() == 1
        and not says_no_norm(type_name)
    ):
        return "it keeps a 1-D weight and has no child modules"
    return None


def _read(
    program: Any, names: dict[str, str], path: str, type_name: str, position: int, nodes: list, why: str
) -> ProgramModule | None:
    """The module's verdict; None for one that normalizes a parameter (data_flow.py),
    which is part of that parameter."""
    native = any(op_name(n) in OP_KINDS for n in nodes)
    opaque = [operator_of(n) for n in nodes if is_opaque(n)]
    if opaque:  # a library operator kept as a stand-in (pt2/opaque_operators.py): what it computes is unknown
        reason = f"it calls {opaque[0]}, which normbridge does not run"
        return ProgramModule(path, type_name, position, why, None, reason, native)
    try:
        group = group_of(program, nodes, prefix=path, names=names)
        if reads_a_parameter(program, group.x):
            return None
        spec = _spec(program, names, group, path, type_name)
    except NotANormalization as error:
        return ProgramModule(path, type_name, position, why, None, str(error), native)
    problem = _prove(program, names, group, spec)
    return ProgramModule(path, type_name, position, why, spec if problem is None else None, problem, native)


def _spec(program: Any, names: dict[str, str], group, path: str, type_name: str) -> NormSpec:
    derivation = derive(group)
    if derivation.native is not None:
        layer = _Reader(program).read(derivation.native, derivation.kind, path, type_name)
        if layer.spec is None:
            raise NotANormalization(f"its {derivation.native.target} could not be read: {layer.problem}")
        return layer.spec.replace(source=layer.spec.source.model_copy(update={"layer_type": type_name}))
    state = {rel: state_tensor(program, names[node.name]) for node, rel in group.state.items()}
    dtype = group.x.meta["val"].dtype
    return build_spec(
        derivation,
        state,
        name=path,
        layer_type=type_name,
        training=False,
        input_dtype=dtype,
        module_class=class_path_of(group.nodes, path),
    )


def _prove(program: Any, names: dict[str, str], group, spec: NormSpec) -> str | None:
    run = runner(group)
    shape = shape_of(group.x)
    x = norm_proof.as_dtype(norm_proof.probe_input(shape, spec.eps), spec.dtype)
    tensors = {node: state_tensor(program, names[node.name]) for node in group.state}
    try:
        y = run(to_torch(x, TORCH_OF[spec.dtype]), tensors)
    except Exception as error:
        return f"its ops fail on the probe ({type(error).__name__})"
    return norm_proof.disagreement(spec, x, y.detach().to(torch.float64).numpy())


__all__ = ["ProgramModule", "program_modules"]
