"""Reading the normalization layers of a torch.export ExportedProgram (.pt2) from its graph.

An ExportedProgram holds no modules, only aten ops with their arguments and the state they
read. torch 2.13's `torch.export.export` emits the training IR, one op per module:
`aten.batch_norm` (training flag, momentum, eps as arguments), `aten.instance_norm`,
`aten.group_norm`, `aten.layer_norm` and `aten.rms_norm`. After `run_decompositions()` the
core-aten forms appear instead: `_native_batch_norm_legit_no_training` (eval),
`_native_batch_norm_legit_functional` (train), `_native_batch_norm_legit.no_stats` (no running
statistics; also InstanceNorm on a reshaped input), `native_group_norm`, `native_layer_norm`;
RMSNorm then dissolves into primitive ops and is reported from its module's metadata alone.
Weights and statistics come from `ep.state_dict` / `ep.constants` through
`ep.graph_signature`; the layer's path and class from each node's `nn_module_stack`.
"""

from __future__ import annotations

from typing import Any

from schemas import NormSpec, SpecError

from ... import recognizers
from .aten_calls import ExportedNormLayer, MODULE_KINDS, _Reader, module_of
from .aten_calls import _arguments, is_exported_program  # noqa: F401 - the model adapter asks it here
from .data_flow import reads_a_parameter
from .exported_computed import program_modules


def exported_norm_layers(program: Any) -> list[ExportedNormLayer]:
    """Every normalization call of `program` (a torch.export.ExportedProgram), in graph order."""
    reader = _Reader(program)
    found: list[tuple[int, ExportedNormLayer]] = []
    seen_modules: dict[str, tuple[int, str]] = {}
    covered: set[str] = set()
    for position, node in enumerate(program.graph.nodes):
        module_path, module_type = module_of(node)
        if module_path is not None and module_type in MODULE_KINDS and module_path not in seen_modules:
            seen_modules[module_path] = (position, module_type)
        kind = recognizers.kind_of("torch", node)  # torch_adapter/recognizers/aten_ops.py
        if kind is None or reads_a_parameter(program, _arguments(node).get("input")):
            continue  # a normalization of a parameter (weight standardization) is part of that parameter: data_flow.py
        if module_path is not None:
            covered.add(module_path)
        found.append((position, reader.read(node, kind, module_path, module_type)))
    for module_path, (position, module_type) in seen_modules.items():
        if module_path not in covered:
            found.append((position, _dissolved(module_path, module_type)))
    found = _with_computed(program, found)
    layers = [layer for _, layer in sorted(found, key=lambda pair: pair[0])]
    return _with_program_mode(layers)


def unused_layers(program: Any) -> frozenset[str]:
    """The paths of the normalization calls none of whose nodes reaches the program's outputs (dead code: exporters drop
    it; a train-mode BatchNorm's statistics updates are outputs, so it is never one)."""
    graph = program.graph
    live, stack = set(), [node for node in graph.nodes if node.op == "output"]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(node.all_input_nodes)
    unused = set()
    for layer in exported_norm_layers(program):
        nodes = [
            n
            for n in graph.nodes
            if n.name == layer.path
            or layer.path in (path for path, _ in (n.meta.get("nn_module_stack") or {}).values())
        ]
        if nodes and not any(n in live for n in nodes):
            unused.add(layer.path)
    return frozenset(unused)


def _with_computed(program: Any, found: list) -> list:
    """Hand-written normalization modules proved from their ops (exported_computed.py) replace the native-op reading of
    them."""
    proved = {m.path: m for m in program_modules(program) if m.spec is not None}
    kept = [(p, layer) for p, layer in found if layer.path not in proved]
    for m in proved.values():
        kept.append(
            (m.position, ExportedNormLayer(m.path, m.spec.kind, "computed", m.module_type, m.spec, m.spec.training))
        )
    return kept


def exported_specs(program: Any) -> list[NormSpec]:
    """The spec of every normalization call; SpecError naming the first layer that cannot be read."""
    specs = []
    for layer in exported_norm_layers(program):
        if layer.spec is None:
            raise SpecError(
                layer.problem
                or f"the {layer.module_type} was decomposed into primitive ops, so its settings cannot be read.",
                layer=layer.path,
            )
        specs.append(layer.spec)
    return specs


# -- the reader ------------------------------------------------------------------------


def _with_program_mode(layers: list[ExportedNormLayer]) -> list[ExportedNormLayer]:
    """Untracked BatchNorms carry no mode of their own (their op always says training=True): give them the program's."""
    tracked = [layer.training for layer in layers if layer.spec is not None and layer.spec.track_running_stats]
    mode = any(tracked)
    out = []
    for layer in layers:
        if (
            layer.kind == "batch"
            and layer.spec is not None
            and not layer.spec.track_running_stats
            and layer.training != mode
        ):
            layer = ExportedNormLayer(
                layer.path,
                layer.kind,
                layer.op,
                layer.module_type,
                layer.spec.replace(training=mode),
                mode,
                layer.native,
                layer.problem,
            )
        out.append(layer)
    return out


def _dissolved(path: str, module_type: str) -> ExportedNormLayer:
    return ExportedNormLayer(
        path,
        MODULE_KINDS[module_type],
        "primitive ops",
        module_type,
        None,
        False,
        native=False,
        problem=f"the {module_type} was decomposed into primitive ops (run_decompositions), so its eps and weights are not readable from one op",
    )


def exported_facts(program: Any) -> list:
    """What inspection reports per normalization call (model_values.LayerFacts)."""
    from ...model_values import LayerFacts

    facts = []
    for layer in exported_norm_layers(program):
        layer_type = layer.module_type or layer.op  # the aten op stays in spec.source.layer_type
        facts.append(
            LayerFacts(
                path=layer.path,
                kind=layer.kind,
                framework="torch",
                origin="exported_program",
                layer_type=layer_type,
                spec=layer.spec,
                training=layer.training,
                native=layer.native,
                problem=None if not layer.native else layer.problem,
                op_types=() if layer.native else ("primitive ops",),
            )
        )
    return facts
