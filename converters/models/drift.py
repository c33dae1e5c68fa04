"""Drift monitor: serving inputs against the statistics every BatchNorm layer froze at training time.

For each BatchNorm layer we measure the per-channel mean and variance of its *input* on a batch
of serving data and compare them with the layer's running statistics: the standardized mean
shift |mean - running_mean| / sqrt(running_var + eps) and the log variance ratio
log((var + eps) / (running_var + eps)) (eps on both sides keeps dead channels finite; it is
negligible elsewhere). Shifted inputs move the first layers most: by the time a shift reaches
deeper layers, earlier BatchNorms and non-linearities have absorbed part of it.

The layer inputs are read without changing the model: forward pre-hooks on the BatchNorm
modules of a deep copy (torch nn.Module), an FX interpreter over the program (ExportedProgram),
each BatchNormalization node's input added as a graph output of a copy (ONNX, onnxruntime), or a
sub-model exposing each BatchNormalization layer's input (functional Keras models).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas import InputFileError, NormbridgeError, UnsupportedObjectError
from schemas.floats import recover_from_float32
from schemas.kinds import KIND_INFO
from schemas.serving import DriftLayer, DriftReport, DriftThresholds

from .loading import framework_of_model
from .samples import Sample, as_sample, input_specs

DEFAULT_THRESHOLDS = DriftThresholds()
DEFAULT_BATCH_SIZE = 64


@dataclass
class LayerMoments:
    """Per-batch moments of one BatchNorm layer's input (float64), with the layer's frozen statistics."""

    name: str
    running_mean: np.ndarray
    running_var: np.ndarray
    eps: float
    counts: list[int] = field(default_factory=list)
    means: list[np.ndarray] = field(default_factory=list)
    variances: list[np.ndarray] = field(default_factory=list)  # biased (ddof=0) within each batch

    @property
    def channels(self) -> int:
        return int(self.running_mean.shape[0])

    def add(self, x: np.ndarray, axis: int) -> None:
        """Record one batch of layer input `x` whose channels are on `axis`."""
        x = np.asarray(x, dtype=np.float64)
        axes = tuple(i for i in range(x.ndim) if i != axis % x.ndim)
        self.counts.append(int(np.prod([x.shape[i] for i in axes])))
        mean = x.mean(axis=axes)
        self.means.append(mean)
        self.variances.append(np.square(x - np.expand_dims(mean, axes)).mean(axis=axes))

    def pooled(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and population variance over every batch together."""
        counts = np.asarray(self.counts, dtype=np.float64)[:, None]
        means, variances = np.stack(self.means), np.stack(self.variances)
        mean = (counts * means).sum(0) / counts.sum()
        var = (counts * (variances + np.square(means - mean))).sum(0) / counts.sum()
        return mean, var


# --------------------------------------------------------------------------- collectors


def batchnorm_modules(module) -> list[tuple[str, Any]]:
    import torch

    return [(name or type(m).__name__, m) for name, m in module.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None]


def _torch_module_moments(module, batches: Iterable[Sequence[np.ndarray]]) -> list[LayerMoments]:
    import torch

    served = copy.deepcopy(module).eval()
    layers = batchnorm_modules(served)
    moments = [LayerMoments(name, m.running_mean.detach().double().numpy().copy(), m.running_var.detach().double().numpy().copy(), float(m.eps))
               for name, m in layers]
    handles = []
    for record, (_, bn) in zip(moments, layers):
        handles.append(bn.register_forward_pre_hook(lambda _m, args, record=record: record.add(args[0].detach().numpy(), 1)))
    try:
        with torch.no_grad():
            for batch in batches:
                try:
                    served(*[torch.from_numpy(np.ascontiguousarray(a)) for a in batch])
                except (ValueError, RuntimeError) as error:
                    raise InputFileError(f"the model refused a batch of shape {[list(a.shape) for a in batch]} ({first_line(error)}).") from error
    finally:
        for handle in handles:
            handle.remove()
    return moments


BATCH = KIND_INFO["batch"]


def program_batchnorm_moments(program, batches: Iterable[Sequence[np.ndarray]], train: bool = False) -> list[LayerMoments]:
    """BatchNorm inputs of an ExportedProgram, read by an FX interpreter over `program.module()`.

    Layers are named after their running_mean buffer ('features.1.running_mean' -> 'features.1').
    With `train`, each BatchNorm normalizes with its batch statistics (what a PyTorch
    recalibration forward computes) and the running buffers are left alone.
    """
    import torch
    import torch.nn.functional as F
    from torch.fx.operator_schemas import normalize_function

    module = program.module()
    buffer_names = {id(t): name for name, t in module.named_buffers()}
    moments: dict[str, LayerMoments] = {}

    class Recorder(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            schema = getattr(target, "_schema", None)
            if schema is None or schema.name not in BATCH.aten_ops:
                return super().call_function(target, args, kwargs)
            bound = normalize_function(target, args, kwargs, normalize_to_only_use_kwargs=True).kwargs
            running_mean, running_var = bound.get("running_mean"), bound.get("running_var")
            if running_mean is None:
                return super().call_function(target, args, kwargs)
            name = buffer_names.get(id(running_mean), f"batch_norm_{len(moments)}").removesuffix(".running_mean")
            if name not in moments:
                moments[name] = LayerMoments(name, running_mean.double().numpy().copy(), running_var.double().numpy().copy(), float(bound["eps"]))
            moments[name].add(bound["input"].numpy(), 1)
            if not train:
                return super().call_function(target, args, kwargs)
            out = F.batch_norm(bound["input"], None, None, bound.get("weight"), bound.get("bias"), training=True, momentum=0.0, eps=bound["eps"])
            extra = len(schema.returns) - 1
            return out if extra == 0 else (out,) + tuple(torch.empty(0) for _ in range(extra))

    recorder = Recorder(module)
    with torch.no_grad():
        for batch in batches:
            try:
                recorder.run(*[torch.from_numpy(np.ascontiguousarray(a)) for a in batch])
            except NormbridgeError:
                raise
            except Exception as error:  # guards of a fixed-shape program, a batch of one in train mode, ...
                raise InputFileError(f"the ExportedProgram refused a batch of shape {[list(a.shape) for a in batch]} ({type(error).__name__}: {first_line(error)}).") from error
    return list(moments.values())


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


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
    """Every BatchNormalization node in graph order, named after its running-mean initializer when it ends in '.running_mean'."""
    from onnx import helper

    found = []
    for index, node in enumerate(model.graph.node):
        if node.op_type != BATCH.onnx_op or node.domain not in ("", "ai.onnx"):
            continue
        eps = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon"), BATCH.default_eps["onnx"])
        mean_name = node.input[3]
        name = mean_name.removesuffix(".running_mean") if mean_name.endswith(".running_mean") else (node.name or node.output[0])
        found.append(OnnxBatchNorm(index, name, node.input[0], mean_name, node.input[4], recover_from_float32(eps)))
    return found


def onnx_constant(model, name: str) -> np.ndarray:
    """The value of an initializer or Constant node output called `name`."""
    from onnx import numpy_helper

    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name and node.attribute and node.attribute[0].name == "value":
            return numpy_helper.to_array(node.attribute[0].t)
    raise UnsupportedObjectError(f"ONNX tensor '{name}' is computed, not stored; only BatchNormalization nodes with stored statistics are supported.")


def _with_outputs(model, names: list[str], train: bool):
    """A copy of `model` that also returns the tensors `names`; with `train`, BatchNormalization uses batch statistics."""
    import onnx
    from onnx import helper

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


def onnx_batchnorm_moments(model, batches: Iterable[Sequence[np.ndarray]], train: bool = False) -> list[LayerMoments]:
    """BatchNormalization inputs of an ONNX model, as extra graph outputs of a copy run in onnxruntime (graph as written)."""
    import onnxruntime

    sites = onnx_batchnorms(model)
    if not sites:
        return []
    moments = [LayerMoments(s.name, onnx_constant(model, s.mean_name).astype(np.float64), onnx_constant(model, s.var_name).astype(np.float64), s.eps)
               for s in sites]
    probe = _with_outputs(model, [s.input for s in sites], train)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    # As written: with optimizations on, onnxruntime 1.32 miscomputes training_mode=1 BatchNormalization whose statistic outputs are unused.
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    input_names = [i.name for i in session.get_inputs()]
    output_names = [o.name for o in session.get_outputs()]
    wanted = [s.input if s.input in output_names else next(n for n in output_names if n.startswith(f"{s.input}__normbridge_probe_")) for s in sites]
    for batch in batches:
        try:
            values = session.run(wanted, dict(zip(input_names, batch)))
        except Exception as error:  # onnxruntime's InvalidArgument for a wrong shape or dtype
            raise InputFileError(f"onnxruntime refused a batch of shape {[list(a.shape) for a in batch]} ({first_line(error)}).") from error
        for record, value in zip(moments, values):
            record.add(value, 1)
    return moments


def _keras_moments(model, batches: Iterable[Sequence[np.ndarray]]) -> list[LayerMoments]:
    from converters.keras_adapter.common import import_keras

    keras = import_keras()
    layers = [layer for layer in model._flatten_layers(include_self=False, recursive=True) if isinstance(layer, keras.layers.BatchNormalization)]
    if not layers:
        return []
    try:
        probe = keras.Model(model.inputs, [layer.input for layer in layers])
    except (AttributeError, ValueError) as error:
        raise UnsupportedObjectError(f"cannot read the BatchNormalization inputs of Keras model '{model.name}' ({error}); drift supports functional Keras models.") from error
    moments = []
    for layer in layers:
        mean, var = (keras.ops.convert_to_numpy(w).astype(np.float64) for w in (layer.moving_mean, layer.moving_variance))
        moments.append(LayerMoments(layer.name, mean, var, float(layer.epsilon)))
    axes = [layer.axis if isinstance(layer.axis, int) else layer.axis[0] for layer in layers]
    for batch in batches:
        values = probe(batch[0] if len(batch) == 1 else list(batch), training=False)
        values = values if isinstance(values, (list, tuple)) else [values]
        for record, value, axis in zip(moments, values, axes):
            record.add(keras.ops.convert_to_numpy(value), axis)
    return moments


def batchnorm_moments(model: Any, batches: Iterable[Sequence[np.ndarray]], train: bool = False) -> list[LayerMoments]:
    """The input moments of every BatchNorm layer of a torch module or program, ONNX model or Keras model, in execution order."""
    framework = framework_of_model(model)
    if framework == "onnx":
        return onnx_batchnorm_moments(model, batches, train)
    if framework == "keras":
        if train:
            raise UnsupportedObjectError("train-mode statistics of Keras models are not collected; recalibrate the torch or ONNX model.")
        return _keras_moments(model, batches)
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        return program_batchnorm_moments(model, batches, train)
    if isinstance(model, torch.nn.Module) and not train:
        return _torch_module_moments(model, batches)
    raise UnsupportedObjectError(f"got a {type(model).__name__}; expected a torch.nn.Module, ExportedProgram, Keras model or ONNX model.")


# --------------------------------------------------------------------------- the monitor


def layer_drift(moments: LayerMoments, thresholds: DriftThresholds) -> DriftLayer:
    """Standardized mean shift and log variance ratio of one layer, per channel, summarized."""
    mean, var = moments.pooled()
    scale = np.sqrt(moments.running_var + moments.eps)
    shift = np.abs(mean - moments.running_mean) / scale
    log_ratio = np.abs(np.log((var + moments.eps) / (moments.running_var + moments.eps)))
    alarm = bool(shift.max() > thresholds.shift or log_ratio.max() > thresholds.log_ratio)
    return DriftLayer(
        name=moments.name, channels=moments.channels,
        max_shift=float(shift.max()), mean_shift=float(shift.mean()), worst_shift_channel=int(shift.argmax()),
        max_abs_log_ratio=float(log_ratio.max()), mean_abs_log_ratio=float(log_ratio.mean()), worst_ratio_channel=int(log_ratio.argmax()),
        alarm=alarm,
    )


def fixed_batch_size(model: Any) -> int | None:
    """The batch size a model was exported with, when it accepts no other."""
    try:
        specs = input_specs(model)
    except UnsupportedObjectError:
        return None
    sizes = {s.shape[0] for s in specs if s.shape}
    return sizes.pop() if len(sizes) == 1 and None not in sizes else None


def data_batches(model: Any, data: Any, batch_size: int | None) -> tuple[Sample, list[tuple[np.ndarray, ...]]]:
    """The data as a Sample and its batches; a model with a fixed batch size gets batches of that size."""
    try:
        specs = input_specs(model)
    except UnsupportedObjectError:
        specs = None
    if data is None:
        raise InputFileError("no data given; pass serving inputs as an array or a .npy/.npz file.")
    sample = as_sample(data, specs)
    fixed = fixed_batch_size(model)
    if fixed is not None:
        if sample.batch_size % fixed:
            raise InputFileError(f"the model accepts batches of exactly {fixed} and the data has {sample.batch_size} samples; pass a multiple of {fixed}.")
        batch_size = fixed
    return sample, list(sample.batches(batch_size))


def describe(model: Any) -> str:
    """A short name for a model in reports."""
    framework = framework_of_model(model)
    if framework == "onnx":
        return f"onnx '{model.graph.name or 'graph'}'"
    if framework == "keras":
        return f"keras '{model.name}'"
    return f"torch {type(model).__name__}"


def drift_check(model: Any, data: Any, thresholds: DriftThresholds | dict | None = None, *, batch_size: int | None = DEFAULT_BATCH_SIZE) -> DriftReport:
    """Compare every BatchNorm layer's serving-time input statistics with its running statistics.

    Args:
        model: torch.nn.Module, ExportedProgram, onnx.ModelProto or functional keras.Model.
        data: serving inputs: an array, a tuple of arrays (one per input), a .npy/.npz path or a Sample.
        thresholds: DriftThresholds, or a dict with 'shift' and/or 'log_ratio'; defaults 0.5 and log(2).
        batch_size: inputs per forward pass (memory only: statistics are pooled over all of them).
    """
    if isinstance(thresholds, dict):
        thresholds = DriftThresholds(**thresholds)
    thresholds = thresholds or DEFAULT_THRESHOLDS
    sample, batches = data_batches(model, data, batch_size)
    moments = batchnorm_moments(model, batches)
    if not moments:
        raise UnsupportedObjectError(
            f"{describe(model)} has no BatchNorm layer with running statistics to monitor (an exporter may have folded them into the "
            "preceding Conv: export with `normbridge export`, which keeps them)."
        )
    layers = [layer_drift(m, thresholds) for m in moments]
    alarms = [layer.name for layer in layers if layer.alarm]
    return DriftReport(
        model=describe(model), framework=framework_of_model(model), samples=sample.batch_size, thresholds=thresholds,
        variance="population variance (ddof=0) per channel over batch and spatial positions; ratio (var + eps) / (running_var + eps)",
        layers=layers, alarms=alarms, verdict="drift" if alarms else "no drift",
    )


__all__ = ["DEFAULT_THRESHOLDS", "LayerMoments", "batchnorm_moments", "drift_check", "layer_drift", "onnx_batchnorms"]
