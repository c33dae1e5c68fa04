"""Recalibrating the BatchNormalization statistics of ONNX models: population statistics, wave by wave, in eval mode.

Each pass runs, in onnxruntime (graph as written, no optimizations, as `drift` reads it), a copy of the model whose
already finalized BatchNormalization nodes read their new statistics from initializers of their own and whose graph
outputs are the inputs of the wave's nodes, pruned to the nodes those outputs need. A layer's new statistics are its
input's mean and variance over every sample (model_values.population_statistics); the waves come from the graph
(converters/recalibration_waves.py). Nodes sharing their statistic initializers are one layer: both uses are pooled.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import numpy_helper

from ..model_values import LayerMoments, Movement, population_statistics
from ..recalibration_waves import upstream_layers, waves
from .statistics import OnnxBatchNorm, _with_outputs, accumulate_outputs, onnx_batchnorms, onnx_constant


def _has_subgraph(node) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _upstream(model, layer_of: dict[int, str]) -> dict[str, set[str]]:
    """Each layer's upstream layers from the graph; a node with a subgraph (If, Loop, Scan) may read any name of the
    outer scope, so it is taken to read everything before it."""
    steps, seen = [], []
    for index, node in enumerate(model.graph.node):
        inputs = seen if _has_subgraph(node) else [name for name in node.input if name]
        steps.append((list(inputs), list(node.output), layer_of.get(index)))
        seen.extend(node.output)
    return upstream_layers(steps)


def _pruned(probe, wanted: list[str]):
    """`probe` with only the outputs `wanted` and the nodes they need (unless a node has a subgraph, whose reads are not
    listed)."""
    outputs = [o for o in probe.graph.output if o.name in wanted]
    del probe.graph.output[:]
    probe.graph.output.extend(outputs)
    if any(_has_subgraph(node) for node in probe.graph.node):
        return probe
    needed, kept = set(wanted), []
    for node in reversed(list(probe.graph.node)):
        if needed.intersection(node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    del probe.graph.node[:]
    probe.graph.node.extend(reversed(kept))
    return probe


def _wave_probe(
    model,
    sites: list[OnnxBatchNorm],
    layer_of: dict[int, str],
    stats: dict[str, tuple[np.ndarray, np.ndarray]],
    wanted: list[str],
):
    """A copy of `model` whose finalized nodes read their new statistics and which returns the tensors `wanted`."""
    probe = copy.deepcopy(model)
    for site in sites:
        name = layer_of[site.index]
        if name not in stats:
            continue
        node = probe.graph.node[site.index]
        for slot, value in ((3, stats[name][0]), (4, stats[name][1])):
            fresh = f"{node.input[slot]}__normbridge_recalibrated_{site.index}"
            probe.graph.initializer.append(numpy_helper.from_array(value, fresh))
            node.input[slot] = fresh
    return _pruned(_with_outputs(probe, wanted, train=False), _output_names(probe, wanted))


def _output_names(model, wanted: list[str]) -> list[str]:
    """The graph output each wanted tensor comes out as (_with_outputs passes a graph input through an Identity)."""
    inputs = {i.name for i in model.graph.input}
    return [f"{name}__normbridge_probe_{i}" if name in inputs else name for i, name in enumerate(dict.fromkeys(wanted))]


def _measure(probe, batches: list[tuple[np.ndarray, ...]], outputs: list[str], records: list[LayerMoments]) -> None:
    accumulate_outputs(probe, batches, outputs, records, "a recalibration batch")


def recalibrate_onnx(
    model, batches: list[tuple[np.ndarray, ...]], variance_estimator: str
) -> tuple[onnx.ModelProto, list[Movement], str]:
    """A copy of `model` whose BatchNormalization statistics are the population statistics of their inputs
    (module docstring)."""
    sites = onnx_batchnorms(model)
    layer_of = {site.index: site.name for site in sites}
    by_layer: dict[str, list[OnnxBatchNorm]] = {}
    for site in sites:
        by_layer.setdefault(site.name, []).append(site)
    dtypes = {name: onnx_constant(model, uses[0].mean_name).dtype for name, uses in by_layer.items()}
    olds = {
        name: (
            onnx_constant(model, uses[0].mean_name).astype(np.float64),
            onnx_constant(model, uses[0].var_name).astype(np.float64),
        )
        for name, uses in by_layer.items()
    }
    stats: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    computed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for wave in waves(list(by_layer), _upstream(model, layer_of)):
        uses = [(name, site) for name in wave for site in by_layer[name]]
        records = {name: LayerMoments(name, *olds[name], by_layer[name][0].eps) for name in wave}
        wanted = [site.input for _, site in uses]
        probe = _wave_probe(model, sites, layer_of, stats, wanted)
        outputs = _output_names(model, wanted)
        position = {name: i for i, name in enumerate(dict.fromkeys(wanted))}
        _measure(
            probe, batches, [outputs[position[site.input]] for _, site in uses], [records[name] for name, _ in uses]
        )
        for name in wave:
            mean, var = population_statistics(records[name], variance_estimator)
            computed[name] = (mean, var)
            stats[name] = (mean.astype(dtypes[name]), var.astype(dtypes[name]))
    new = _written(model, by_layer, stats)
    moved = [(name, *olds[name], *computed[name], by_layer[name][0].eps) for name in by_layer]
    method = (
        "onnxruntime in eval mode (graph as written): population statistics of each BatchNormalization's input over all samples "
        f"(pooled in float64), measured wave by wave with the nodes upstream on their new statistics; {variance_estimator} variance "
        "written into the mean/var initializers"
    )
    return new, moved, method


def _written(model, by_layer: dict[str, list[OnnxBatchNorm]], stats: dict[str, tuple[np.ndarray, np.ndarray]]):
    """A copy of `model` with the new statistics in place: an initializer only this layer reads is overwritten, else (a
    Constant node, or shared with another layer) the layer's nodes get an initializer of their own."""
    new = copy.deepcopy(model)
    initializers = {init.name: init for init in new.graph.initializer}
    readers: dict[str, set[str]] = {}
    layer_of = {site.index: name for name, uses in by_layer.items() for site in uses}
    for index, node in enumerate(new.graph.node):
        for name in node.input:
            readers.setdefault(name, set()).add(layer_of.get(index, f"node {index}"))
    for name, uses in by_layer.items():
        for slot, tensor_name, value in ((3, uses[0].mean_name, stats[name][0]), (4, uses[0].var_name, stats[name][1])):
            old = initializers.get(tensor_name)
            if old is not None and readers.get(tensor_name) == {name}:
                old.CopyFrom(numpy_helper.from_array(value, tensor_name))
                continue
            fresh = f"{name}.{'running_mean' if slot == 3 else 'running_var'}.recalibrated"
            new.graph.initializer.append(numpy_helper.from_array(value, fresh))
            for site in uses:
                new.graph.node[site.index].input[slot] = fresh
    return new


__all__ = ["recalibrate_onnx"]
