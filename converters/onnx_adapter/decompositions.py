"""Primitive-op graphs for opsets below the native op, and reading them back.

Below LayerNormalization-17, RMSNormalization-23 and GroupNormalization-21 the layer is
written as the ops the ONNX function bodies use. GroupNormalization-18 is never
emitted: it had per-group scale and bias and is deprecated. float16 statistics are
computed in float32 (Cast in, Cast out, then the affine in the layer's dtype).

Reading back is limited to what normbridge emitted: the metadata gives the spec, the
named initializers give eps, scale and bias, and the graph must equal what
`from_spec` builds for that spec. Foreign decompositions are refused.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np
import onnx
from onnx import helper, numpy_helper

from schemas import LayerReport, NormSpec, UnsupportedObjectError
from schemas.kinds import KIND_INFO

from ..adapter import KindAdapter
from ..options import ConversionOptions
from . import metadata, reading
from .layer_graph import INPUT, LayerGraph, element_type
from .reading import OnnxLayer

#: ReduceMean takes `axes` as an input from ReduceMean-18, as an attribute before.
AXES_INPUT_OPSET = 18


def start(spec: NormSpec, options: ConversionOptions, report: LayerReport) -> LayerGraph:
    """A graph builder for a decomposition; eps is an exact constant unless float32 is involved."""
    constant = spec.kind != "group" and spec.dtype == "float64"
    return LayerGraph(spec, options, report, eps_float32=not constant)


def normalize_trailing(g: LayerGraph, x: str, count: int, *, centre: bool) -> str:
    """(x - mean) / sqrt(var + eps), or x / sqrt(mean(x^2) + eps) without centring, over the last `count` axes."""
    dtype = g.spec.dtype
    compute = "float32" if dtype in ("float16", "bfloat16") else dtype
    if compute != dtype:
        x = g.node("Cast", [x], to=element_type(compute))
    axes = list(range(-count, 0))
    axes_input = g.tensor("axes", np.array(axes, dtype=np.int64)) if g.opset >= AXES_INPUT_OPSET else None

    def mean(value: str) -> str:
        if axes_input:
            return g.node("ReduceMean", [value, axes_input], keepdims=1)
        return g.node("ReduceMean", [value], axes=axes, keepdims=1)

    eps = g.tensor("epsilon", np.array(g.eps, dtype=compute))
    centred = g.node("Sub", [x, mean(x)]) if centre else x
    spread = mean(g.node("Mul", [centred, centred]))
    y = g.node("Div", [centred, g.node("Sqrt", [g.node("Add", [spread, eps])])])
    return g.node("Cast", [y], to=element_type(dtype)) if compute != dtype else y


def apply_affine(g: LayerGraph, y: str, shape: tuple[int, ...] | None = None) -> str:
    """Mul by scale and Add bias where the spec has them (reshaped to `shape` for broadcasting)."""
    if g.spec.scale:
        y = g.node("Mul", [y, g.state("scale", shape)])
    if g.spec.bias:
        y = g.node("Add", [y, g.state("bias", shape)])
    return y


def finish(g: LayerGraph, y: str) -> onnx.ModelProto:
    ops = ",".join(node.op_type for node in g.nodes)
    g.report.warn(f"opset {g.opset} has no native op for this layer: emitted the decomposition {ops}.")
    return g.finish(y, f"decomposition({ops})", native=False)


def trailing_norm(spec: NormSpec, options: ConversionOptions, report: LayerReport, *, centre: bool) -> onnx.ModelProto:
    """LayerNorm (centre=True) or RMSNorm (centre=False) below its native opset."""
    g = start(spec, options, report)
    return finish(g, apply_affine(g, normalize_trailing(g, INPUT, len(spec.normalized_shape), centre=centre)))


def group_norm(spec: NormSpec, options: ConversionOptions, report: LayerReport) -> onnx.ModelProto:
    """Reshape to (N, G, -1), InstanceNormalization, reshape to (N, C, -1), per-channel affine,
    reshape back to X's shape.

    torch's dynamo export applies the affine after reshaping back to X's shape, which needs X's
    rank for the (C, 1, ..., 1) constants; applying it on (N, C, -1) takes X of any rank >= 2.
    """
    g = start(spec, options, report)
    groups = spec.num_groups
    grouped = g.node("Reshape", [INPUT, g.tensor("group_shape", np.array([0, groups, -1], dtype=np.int64))])
    normalized = g.instance_norm(
        grouped,
        g.tensor("group_scale", np.ones(groups, spec.dtype)),
        g.tensor("group_bias", np.zeros(groups, spec.dtype)),
    )
    y = normalized
    if spec.scale or spec.bias:
        y = apply_affine(
            g,
            g.node("Reshape", [y, g.tensor("channel_shape", np.array([0, spec.num_features, -1], dtype=np.int64))]),
            (spec.num_features, 1),
        )
    return finish(g, g.node("Reshape", [y, g.node("Shape", [INPUT])]))


def read(layer: OnnxLayer, report: LayerReport, adapter) -> NormSpec:
    """The spec of a decomposition normbridge emitted; UnsupportedObjectError if the graph is not exactly that."""
    meta = layer.metadata(report)
    name = layer.name
    config = {key: value for key, value in meta.items() if key in NormSpec.model_fields and key != "tensors"}
    constant = layer.initializers.get(f"{name}.epsilon")
    if constant is not None:
        eps, eps_origin = metadata.eps(report, meta, float(constant), float32=constant.dtype != np.float64)
    else:
        # GroupNorm's decomposition holds an InstanceNormalization, a channels-first LayerNorm a LayerNormalization
        # (layer.py).
        ops = {KIND_INFO[kind].onnx_op: KIND_INFO[kind] for kind in ("instance", "layer")}
        node = next((n for n in layer.model.graph.node if n.op_type in ops), None)
        if node is None:
            raise UnsupportedObjectError(
                f"the graph carries '{metadata.KEY}' metadata of layer '{name}' but no '{name}.epsilon' initializer, "
                "InstanceNormalization or LayerNormalization, expected a decomposition normbridge emitted."
            )
        default = ops[node.op_type].default_eps["onnx"]
        stored = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon"), default)
        eps, eps_origin = metadata.eps(report, meta, stored)
    try:
        shape = tuple(int(d) for d in meta.get("normalized_shape") or [meta.get("num_features")])
    except (TypeError, ValueError):
        shape = ()  # the spec built below reports what is wrong with the metadata
    tensors = {}
    for field in ("scale", "bias"):
        array = layer.initializers.get(f"{name}.{field}")
        if meta.get(field) and array is not None and array.size == int(np.prod(shape)):
            tensors[field] = array.reshape(shape)
    config.update(dtype=layer.dtype, eps=eps, eps_origin=eps_origin, source=layer.source())
    spec = reading.build(config, tensors)
    scratch = LayerReport(layer=name, kind=spec.kind, source_framework="spec", target_framework="onnx", target_op="?")
    expected = adapter.from_spec(spec, ConversionOptions(opset=layer.opset), scratch)
    difference = first_difference(layer.model.graph, expected.graph)
    if difference:
        raise UnsupportedObjectError(
            f"the graph carries '{metadata.KEY}' metadata of a {spec.kind} layer but differs from the decomposition normbridge emits for it "
            f"({difference}); convert the original layer again instead of an edited graph."
        )
    return spec


def first_difference(found: onnx.GraphProto, expected: onnx.GraphProto) -> str | None:
    """The first node or initializer where two graphs differ, described in a few words; None if they agree."""

    def nodes(graph):
        return [
            (
                n.op_type,
                list(n.input),
                list(n.output),
                sorted((a.name, repr(helper.get_attribute_value(a))) for a in n.attribute),
            )
            for n in graph.node
        ]

    def initializers(graph):
        return {t.name: (t.data_type, list(t.dims), numpy_helper.to_array(t).tobytes()) for t in graph.initializer}

    for index, (a, b) in enumerate(zip(nodes(found), nodes(expected))):
        if a != b:
            return (
                f"node {index} is {a[0]} where {b[0]} with other inputs or attributes was expected"
                if a[0] != b[0]
                else f"node {index} ({a[0]}) has other inputs, outputs or attributes"
            )
    if len(found.node) != len(expected.node):
        return f"{len(found.node)} nodes, expected {len(expected.node)}"
    have, want = initializers(found), initializers(expected)
    for key in sorted(set(have) | set(want)):
        if have.get(key) != want.get(key):
            return f"initializer '{key}' differs"
    return None


class DecomposableAdapter(KindAdapter):
    """A kind with a native op from `native_opset` on and a decomposition below it."""

    native_opset: ClassVar[int]

    @abc.abstractmethod
    def read_native(self, layer: OnnxLayer, report: LayerReport) -> NormSpec:
        """The spec of the native node."""

    @abc.abstractmethod
    def emit_native(self, g: LayerGraph) -> onnx.ModelProto:
        """The native node's graph."""

    @abc.abstractmethod
    def decompose(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> onnx.ModelProto:
        """The decomposition's graph."""

    def to_spec(self, obj, report: LayerReport) -> NormSpec:
        layer = reading.parse(obj, self.kind)
        return read(layer, report, self) if layer.node is None else self.read_native(layer, report)

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> onnx.ModelProto:
        if options.opset < self.native_opset:
            return self.decompose(spec, options, report)
        return self.emit_native(LayerGraph(spec, options, report))
