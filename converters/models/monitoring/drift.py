"""Drift monitor: serving inputs against the statistics every BatchNorm layer froze at training time.

For each BatchNorm layer we measure the per-channel mean and variance of its *input* on a batch
of serving data and compare them with the layer's running statistics: the standardized mean
shift |mean - running_mean| / sqrt(running_var + eps) and the log variance ratio
log((var + eps) / (running_var + eps)) (eps on both sides keeps dead channels finite; it is
negligible elsewhere). Shifted inputs move the first layers most: by the time a shift reaches
deeper layers, earlier BatchNorms and non-linearities have absorbed part of it. A layer that alarms
because its statistics never converged (convergence.py) is `unconverged_statistics`, not drift.

The layer inputs are read by the model's adapter without changing the model (ModelAdapter.batchnorm_moments):
forward pre-hooks on the BatchNorm modules of a deep copy (torch nn.Module), an FX interpreter over
the program (ExportedProgram), each BatchNormalization node's input added as a graph output of a
copy (ONNX, onnxruntime), or a sub-model exposing each BatchNormalization layer's input (functional
Keras models).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from schemas import InputFileError, UnsupportedObjectError
from schemas.floats import is_float_dtype
from schemas.monitoring import statistics_digest
from schemas.serving import DriftLayer, DriftReport, DriftThresholds

from ...adapters import REGISTRY
from ...model_values import LayerMoments
from ..serving.samples import Sample, as_sample, input_specs
from .convergence import blamed_on_unconverged, judge

DEFAULT_THRESHOLDS = DriftThresholds()
DEFAULT_BATCH_SIZE = 64


def batchnorm_moments(model: Any, batches: Iterable[Sequence[np.ndarray]], train: bool = False) -> list[LayerMoments]:
    """The input moments of every BatchNorm layer of a torch module or program, ONNX model or Keras model,
    in execution order."""
    return REGISTRY.model_adapter_of(model).batchnorm_moments(model, batches, train)


# --------------------------------------------------------------------------- the monitor


def channel_shift(mean, var, running_mean, running_var, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Per channel: the standardized mean shift |mean - running_mean| / sqrt(running_var + eps) and the log variance
    ratio log((var + eps) / (running_var + eps)) (signed), in float64. The one definition `drift` and the registry's
    history share."""
    mean, var, running_mean, running_var = (
        np.asarray(a, dtype=np.float64) for a in (mean, var, running_mean, running_var)
    )
    shift = np.abs(mean - running_mean) / np.sqrt(running_var + eps)
    return shift, np.log((var + eps) / (running_var + eps))


def layer_drift(moments: LayerMoments, thresholds: DriftThresholds) -> DriftLayer:
    """Standardized mean shift and log variance ratio of one layer, per channel, summarized,
    and why it alarms (convergence.py)."""
    mean, var = moments.pooled()
    shift, signed_log_ratio = channel_shift(mean, var, moments.running_mean, moments.running_var, moments.eps)
    log_ratio = np.abs(signed_log_ratio)
    alarm = bool(shift.max() > thresholds.shift or log_ratio.max() > thresholds.log_ratio)
    verdict = judge(
        mean,
        var,
        moments.running_mean,
        moments.running_var,
        moments.eps,
        thresholds,
        alarm,
        moments.batches_tracked,
        moments.momentum,
    )
    return DriftLayer(
        name=moments.name,
        channels=moments.channels,
        max_shift=float(shift.max()),
        mean_shift=float(shift.mean()),
        worst_shift_channel=int(shift.argmax()),
        max_abs_log_ratio=float(log_ratio.max()),
        mean_abs_log_ratio=float(log_ratio.mean()),
        worst_ratio_channel=int(log_ratio.argmax()),
        alarm=alarm,
        status=verdict.status,
        reason=verdict.reason,
        batches_tracked=moments.batches_tracked,
        momentum=moments.momentum,
        initial_weight=verdict.initial_weight,
    )


def downstream_of_unconverged(layers: list[DriftLayer]) -> list[DriftLayer]:
    """Alarms after an unconverged layer are that layer's doing, not the input's (convergence.blamed_on_unconverged)."""
    first, blamed = blamed_on_unconverged(layers)
    reason = (
        f"downstream of '{first}', whose statistics never converged: in eval mode it normalizes with statistics its training "
        "batches never had, so this layer's input differs from its training input although the served input did not move"
    )
    return [
        layer.model_copy(update={"status": "unconverged_statistics", "reason": reason}) if i in blamed else layer
        for i, layer in enumerate(layers)
    ]


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
    _refuse_unmeasurable(sample)
    fixed = fixed_batch_size(model)
    if fixed is not None:
        if sample.batch_size % fixed:
            raise InputFileError(
                f"the model accepts batches of exactly {fixed} and the data has {sample.batch_size} samples; pass a multiple of {fixed}."
            )
        batch_size = fixed
    return sample, list(sample.batches(batch_size))


def _refuse_unmeasurable(sample: Sample) -> None:
    """No samples, or a NaN or infinite value, measure nothing: a NaN mean compares as no drift (the report said so)."""
    where = f"'{sample.path}'" if sample.path else "the data"
    if sample.batch_size == 0:
        raise InputFileError(f"{where} holds no samples (its batch axis is empty); pass at least one serving input.")
    refuse_non_finite(sample.arrays, sample.names, where)


def refuse_non_finite(arrays: Sequence[np.ndarray], names: Sequence[str], where: str) -> None:
    """InputFileError naming the input, the count and the first sample holding a NaN or infinite value."""
    for name, array in zip(names, arrays):
        if is_float_dtype(array.dtype):
            bad = ~np.isfinite(array)  # in the array's own dtype (ml_dtypes' bfloat16 too): no float64 copy of the data
            if bad.any():
                first = int(np.argwhere(bad.reshape(bad.shape[0], -1).any(axis=1))[0, 0]) if bad.ndim else 0
                raise InputFileError(
                    f"{where}: input '{name}' holds {int(bad.sum())} NaN or infinite values (the first in sample {first}); "
                    "statistics of such inputs are not numbers: drop or repair those samples."
                )


def describe(model: Any) -> str:
    """A short name for a model in reports."""
    return REGISTRY.model_adapter_of(model).describe(model)


def drift_check(
    model: Any,
    data: Any,
    thresholds: DriftThresholds | dict | None = None,
    *,
    batch_size: int | None = DEFAULT_BATCH_SIZE,
) -> DriftReport:
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
    layers = downstream_of_unconverged([layer_drift(m, thresholds) for m in moments])
    alarms = [layer.name for layer in layers if layer.status == "drift"]
    unconverged = [layer.name for layer in layers if layer.status == "unconverged_statistics"]
    return DriftReport(
        model=describe(model),
        framework=REGISTRY.model_framework(model),
        samples=sample.batch_size,
        thresholds=thresholds,
        variance="population variance (ddof=0) per channel over batch and spatial positions; ratio (var + eps) / (running_var + eps)",
        layers=layers,
        alarms=alarms,
        unconverged=unconverged,
        verdict="drift" if alarms else "unconverged statistics" if unconverged else "no drift",
        statistics_digest=statistics_digest((m.running_mean, m.running_var) for m in moments),
    )


__all__ = ["DEFAULT_THRESHOLDS", "LayerMoments", "batchnorm_moments", "channel_shift", "drift_check", "layer_drift"]
