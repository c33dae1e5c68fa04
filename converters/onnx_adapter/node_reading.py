"""Reading the native normalization nodes inside a larger ONNX graph into NormSpecs.

`reading.parse` accepts only a one-layer model, because guessing which node is "the layer"
would convert the wrong thing. Inside a whole model the caller has already chosen the node,
so here the same per-kind readers run on an `OnnxLayer` built around that node: its state
tensors must be constants (initializers or Constant nodes), its input's rank must be known
(from shape inference), and the model-level normbridge metadata is ignored (it describes a
one-layer model, not one node of many).
"""

from __future__ import annotations

import numpy as np
import onnx

from schemas import LayerReport, NormSpec, SpecError, UnsupportedObjectError

from .. import recognizers
from . import reading
from .layer_graph import op_version
from .proto import FLOAT_TYPES, opset_of


def node_layer(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    *,
    constants: dict[str, np.ndarray],
    shape: tuple[int | None, ...] | None,
    elem_type: int | None,
) -> reading.OnnxLayer:
    """An OnnxLayer for `node` of `model`; `constants` maps tensor names to values, `shape` is X's
    (None dims unknown)."""
    kind = recognizers.kind_of("onnx", node)
    if kind is None:
        raise UnsupportedObjectError(
            f"node '{node.name}' is a {node.op_type}, expected one of {', '.join(reading.NATIVE_OPS)}."
        )
    opset = opset_of(model)
    try:
        op_version(node.op_type, opset)
    except onnx.defs.SchemaError:
        raise UnsupportedObjectError(
            f"node '{node.name}': {node.op_type} does not exist at opset {opset}; fix the model's opset_import."
        ) from None
    if elem_type not in FLOAT_TYPES:
        raise SpecError(
            f"the input '{node.input[0]}' of {node.op_type} has no known float element type, expected FLOAT16, FLOAT or DOUBLE; run shape inference on the model.",
            layer=node.name or None,
            setting="dtype",
        )
    if shape is None:
        raise SpecError(
            f"the rank of the input '{node.input[0]}' of {node.op_type} is unknown; the layer's spatial rank depends on it, so give the graph shapes (onnx.shape_inference).",
            layer=node.name or None,
            setting="input_rank",
        )
    graph_inputs = frozenset(i.name for i in model.graph.input)
    return reading.OnnxLayer(
        model,
        kind,
        opset,
        node,
        node.input[0],
        FLOAT_TYPES[elem_type],
        tuple(shape),
        {},
        constants,
        graph_inputs,
    )


def read_node(layer: reading.OnnxLayer, report: LayerReport | None = None) -> NormSpec:
    """The spec of the native node in `layer` (SpecError when its state is not constant or inconsistent)."""
    from .batch import read_batch_norm
    from .group import read_group_norm
    from .instance import read_instance_norm

    report = report or LayerReport(
        layer=layer.name, kind=layer.kind, source_framework="onnx", target_framework="spec", target_op="NormSpec"
    )
    op = layer.node.op_type
    if op == "BatchNormalization":
        return read_batch_norm(layer, report)
    if op == "InstanceNormalization":
        return read_instance_norm(layer, report)
    if op == "GroupNormalization":
        return read_group_norm(layer, report)
    return reading.read_trailing(layer, report, has_bias=op == "LayerNormalization")


def native_node_specs(model) -> list[NormSpec]:
    """Each native normalization node of an ONNX graph, cut out into a one-node model and read by the ONNX adapter.

    Every node is named by its node name (or '<op>_<index>'), made unique; its input's rank must
    be known after ONNX shape inference.
    """
    from onnx import helper, shape_inference

    from ..api import read_spec

    if not isinstance(model, onnx.ModelProto):
        raise UnsupportedObjectError(
            f"got a {type(model).__module__}.{type(model).__qualname__}, expected an onnx.ModelProto."
        )
    inferred = shape_inference.infer_shapes(model)
    values = {v.name: v for v in list(inferred.graph.input) + list(inferred.graph.value_info)}
    initializers = {t.name: t for t in model.graph.initializer}
    specs: list[NormSpec] = []
    seen: set[str] = set()
    for index, node in enumerate(model.graph.node):
        if recognizers.kind_of("onnx", node) is None:
            continue
        name = node.name or f"{node.op_type}_{index}"
        if name in seen:
            name = f"{name}_{index}"
        seen.add(name)
        x = node.input[0]
        if x not in values or not values[x].type.tensor_type.HasField("shape"):
            raise UnsupportedObjectError(
                f"the shape of input '{x}' of {node.op_type} node '{name}' is unknown after ONNX shape inference, expected at least its rank; "
                "export the model with static input ranks.",
                layer=name,
            )
        x_info = values[x]
        y_info = helper.make_tensor_value_info(node.output[0], x_info.type.tensor_type.elem_type, None)
        single = helper.make_node(node.op_type, list(node.input), [node.output[0]], name=name, domain=node.domain)
        single.attribute.extend(node.attribute)
        graph = helper.make_graph(
            [single],
            name,
            [x_info],
            [y_info],
            initializer=[initializers[i] for i in node.input[1:] if i in initializers],
        )
        piece = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
        spec = read_spec(piece)[0]
        specs.append(spec if spec.name == name else spec.replace(name=name))
    return specs
