"""BatchNorm input statistics of ONNX models (drift, the serving taps and recalibration read them here).

A copy of the model returns each BatchNormalization node's input as an extra graph output and
runs in onnxruntime (graph as written); with `train`, every BatchNormalization of the copy runs
in training_mode=1. Recalibration is recalibration.py's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from schemas import InputFileError, UnsupportedObjectError
from schemas.floats import recover_from_float32
from schemas.kinds import KIND_INFO

from ..model_values import LayerMoments, first_line
from .proto import DEFAULT_DOMAINS

BATCH = KIND_INFO["batch"]


@dataclass(frozen=True)
class OnnxBatchNorm:
    """One BatchNormalization node: its layer name, input tensor and the initializers of its statistics."""

    index: int
    name: str
    input: str
    mean_name: str
    var_name: str
    eps: float


def onnx_batchnorms(model) -> list[OnnxBatchNorm]:
    """Every BatchNormalization node in graph order, named after its running-mean initializer when it ends in
    '.running_mean'."""
    found = []
    for index, node in enumerate(model.graph.node):
        if node.op_type != BATCH.onnx_op or node.domain not in DEFAULT_DOMAINS:
            continue
        eps = next(
            (helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon"), BATCH.default_eps["onnx"]
        )
        mean_name = node.input[3]
        name = (
            mean_name.removesuffix(".running_mean")
            if mean_name.endswith(".running_mean")
            else (node.name or node.output[0])
        )
        found.append(OnnxBatchNorm(index, name, node.input[0], mean_name, node.input[4], recover_from_float32(eps)))
    return found


def onnx_constant(model, name: str) -> np.ndarray:
    """The value of an initializer or Constant node output called `name`."""
    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in model.graph.node:
        if (
            node.op_type == "Constant"
            and node.output[0] == name
            and node.attribute
            and node.attribute[0].name == "value"
        ):
            return numpy_helper.to_array(node.attribute[0].t)
    raise UnsupportedObjectError(
        f"ONNX tensor '{name}' is computed, not stored; only BatchNormalization nodes with stored statistics are supported."
    )


def _with_outputs(model, names: list[str], train: bool):
    """A copy of `model` that also returns the tensors `names`; with `train`,
    BatchNormalization uses batch statistics."""
    probe = copy.deepcopy(model)
    known = {v.name: v for v in list(probe.graph.value_info) + list(probe.graph.input) + list(probe.graph.output)}
    if any(n not in known for n in names):
        try:
            inferred = onnx.shape_inference.infer_shapes(probe)
            known.update({v.name: v for v in inferred.graph.value_info})
        except Exception:  # inference is only used for the element types of the extra outputs
            pass
    existing = {o.name for o in probe.graph.output}
    inputs = {i.name for i in probe.graph.input}
    for i, name in enumerate(dict.fromkeys(names)):
        if name in existing:
            continue
        elem = known[name].type.tensor_type.elem_type if name in known else onnx.TensorProto.FLOAT
        if name in inputs:  # a graph input cannot also be an output: pass it through an Identity
            alias = f"{name}__normbridge_probe_{i}"
            probe.graph.node.append(helper.make_node("Identity", [name], [alias]))
            probe.graph.output.append(helper.make_tensor_value_info(alias, elem, None))
        else:
            probe.graph.output.append(helper.make_tensor_value_info(name, elem, None))
    if train:
        for node in probe.graph.node:
            if node.op_type == "BatchNormalization":
                kept = [a for a in node.attribute if a.name != "training_mode"]
                del node.attribute[:]
                node.attribute.extend(kept + [helper.make_attribute("training_mode", 1)])
                while len(node.output) < 3:  # onnxruntime requires the statistic outputs in training mode
                    node.output.append(f"{node.output[0]}__normbridge_stat_{len(node.output)}")
    return probe


def accumulate_outputs(
    probe, batches: Iterable[Sequence[np.ndarray]], outputs: list[str], records: list[LayerMoments], what: str
) -> None:
    """Run `probe` in onnxruntime on each batch and add output i to records[i]; `what` names a batch in the refusal."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    # As written: with optimizations on, onnxruntime 1.32 miscomputes training_mode=1 BatchNormalization whose statistic
    # outputs are unused.
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    input_names = [i.name for i in session.get_inputs()]
    for batch in batches:
        try:
            values = session.run(outputs, dict(zip(input_names, batch)))
        except Exception as error:  # onnxruntime's InvalidArgument for a wrong shape or dtype
            raise InputFileError(
                f"onnxruntime refused {what} of shape {[list(a.shape) for a in batch]} ({first_line(error)})."
            ) from error
        for record, value in zip(records, values):
            record.add(value, 1)


def onnx_batchnorm_moments(model, batches: Iterable[Sequence[np.ndarray]], train: bool = False) -> list[LayerMoments]:
    """BatchNormalization inputs of an ONNX model, as extra graph outputs of a copy run in onnxruntime
    (graph as written)."""
    sites = onnx_batchnorms(model)
    if not sites:
        return []
    moments = [
        LayerMoments(
            s.name,
            onnx_constant(model, s.mean_name).astype(np.float64),
            onnx_constant(model, s.var_name).astype(np.float64),
            s.eps,
        )
        for s in sites
    ]
    probe = _with_outputs(model, [s.input for s in sites], train)
    output_names = [o.name for o in probe.graph.output]
    wanted = [
        s.input
        if s.input in output_names
        else next(n for n in output_names if n.startswith(f"{s.input}__normbridge_probe_"))
        for s in sites
    ]
    accumulate_outputs(probe, batches, wanted, moments, "a batch")
    return moments
