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
from dataclasses import dataclass
from typing import Any

import torch

from schemas import NormSpec

from . import norm_proof
from .derived_spec import TORCH_OF, build_spec, to_torch
from .aten_calls import MODULE_KINDS, _Reader
from .norm_graph import NATIVE_OPS, NotANormalization, derive, schema, shape_of
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
    names = state_names(program)  # once: each read of the signature's mappings rebuilds them (1.8 ms per module of a decoder)
    keys, children = set(names.values()), _children(groups)
    found = []
    for path, (type_name, position, nodes) in groups.items():
        why = _why(program, path, type_name, groups, children.get(path, ()), keys)
        if why is not None:
            found.append(_read(program, names, path, type_name, position, nodes, why))
    try:
        _CACHE[program] = found
    except TypeError:
        pass
    return found


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
    """path -> the paths of the groups below it (any depth), each found from its own ancestors rather than by comparing every pair."""
    below: dict[str, list[str]] = {}
    for path in groups:
        parts = path.split(".")
        for end in range(1, len(parts)):
            below.setdefault(".".join(parts[:end]), []).append(path)
    return below


def _why(program: Any, path: str, type_name: str, groups: dict, children, keys: set[str]) -> str | None:
    """Why the module at `path` looks like a normalization (None: it does not); `children` are the groups below it, `keys` the
    program's state names."""
    if type_name in MODULE_KINDS or type_name == "SyncBatchNorm":
        return None  # the stock classes are read from their native op
    child_norm = any(groups[p][0] in MODULE_KINDS or names_a_norm(groups[p][0]) for p in children)
    if names_a_norm(type_name) and not child_norm:
        return f"its class name {type_name} contains 'Norm'"
    if not children and f"{path}.weight" in keys and state_tensor(program, f"{path}.weight").dim() == 1 and not says_no_norm(type_name):
        return "it keeps a 1-D weight and has no child modules"
    return None


def _read(program: Any, names: dict[str, str], path: str, type_name: str, position: int, nodes: list, why: str) -> ProgramModule:
    native = any(schema(n) in _native_ops() for n in nodes)
    try:
        group = group_of(program, nodes, prefix=path, names=names)
        spec = _spec(program, names, group, path, type_name)
    except NotANormalization as error:
        return ProgramModule(path, type_name, position, why, None, str(error), native)
    problem = _prove(program, names, group, spec)
    return ProgramModule(path, type_name, position, why, spec if problem is None else None, problem, native)


def _native_ops() -> frozenset:
    return frozenset(NATIVE_OPS)


def _spec(program: Any, names: dict[str, str], group, path: str, type_name: str) -> NormSpec:
    derivation = derive(group)
    if derivation.native is not None:
        layer = _Reader(program).read(derivation.native, derivation.kind, path, type_name)
        if layer.spec is None:
            raise NotANormalization(f"its {derivation.native.target} could not be read: {layer.problem}")
        return layer.spec.replace(source=layer.spec.source.model_copy(update={"layer_type": type_name}))
    state = {rel: state_tensor(program, names[node.name]) for node, rel in group.state.items()}
    dtype = group.x.meta["val"].dtype
    return build_spec(derivation, state, name=path, layer_type=type_name, training=False, input_dtype=dtype,
                      module_class=class_path_of(group.nodes, path))


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
