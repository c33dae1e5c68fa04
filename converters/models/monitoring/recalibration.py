"""Recalibration: re-estimate BatchNorm running statistics on new data, weights untouched.

The new statistics are the population statistics of the data given: for each BatchNorm, the mean and variance of its
input over every sample (and spatial position), pooled in float64 across the forward batches (Chan's parallel formula,
model_values.population_statistics), with the model in eval mode and every BatchNorm upstream of the layer already on
its new statistics, so they are what the recalibrated model computes when it serves the same data and `drift` reads
no shift on it. The batch size is memory only: a program exported with a static batch of 4 gets the same statistics
as one with a dynamic batch (issue 34: an average of per-batch variances over batches of 4, in train mode, was not).
"unbiased" multiplies the variance by n / (n - 1) for the n values per channel in all; "biased" keeps it.

Layers are finalized in waves, one pass over the data each (converters/recalibration_waves.py); each framework's
method is its model adapter's (ModelAdapter.recalibrate):

- torch.nn.Module: a deep copy with forward pre-hooks, one layer per pass in call order (a module has no graph).
- ExportedProgram (.pt2): an FX interpreter computes every batch-norm call in eval mode on the statistics of the
  moment; the new statistics go into a copy of the state dict, the graph is unchanged.
- ONNX: per pass, a copy whose finalized BatchNormalization nodes read their new statistics and whose wave's inputs
  are graph outputs, pruned to what those outputs need, run in onnxruntime; the results replace the initializers.
- Keras (functional): per pass, a sub-model returning the wave's inputs, called with training=False; the results are
  assigned to moving_mean and moving_variance.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas import InputFileError, UnsupportedObjectError
from schemas.serving import RecalibratedLayer, RecalibrationReport

from ...adapters import REGISTRY
from ...model_values import population_statistics
from .drift import data_batches, describe, fixed_batch_size, refuse_non_finite

DEFAULT_BATCH_SIZE = 32


def _given_as_batches(batches: Any) -> bool:
    """Whether `batches` are the caller's own batches (a list of arrays or tuples), not data to split."""
    return isinstance(batches, (list, tuple)) and bool(batches) and not isinstance(batches[0], (int, float))


def _as_batches(model: Any, batches: Any, batch_size: int | None) -> list[tuple[np.ndarray, ...]]:
    """A list of batches (each a tuple of arrays, one per input) from batches or from data to split."""
    if _given_as_batches(batches):
        out = []
        for batch in batches:
            arrays = batch if isinstance(batch, (list, tuple)) else (batch,)
            out.append(tuple(np.asarray(a.detach().numpy() if hasattr(a, "detach") else a) for a in arrays))
            refuse_non_finite(out[-1], [str(k) for k in range(len(arrays))], f"batch {len(out) - 1}")
        return out
    _, split = data_batches(model, batches, batch_size or DEFAULT_BATCH_SIZE)
    return split


def _movement(name: str, old_mean, old_var, new_mean, new_var, eps: float) -> RecalibratedLayer:
    old_mean, old_var, new_mean, new_var = (
        np.asarray(a, dtype=np.float64) for a in (old_mean, old_var, new_mean, new_var)
    )
    shift = np.abs(new_mean - old_mean) / np.sqrt(old_var + eps)
    ratio = np.abs(np.log((new_var + eps) / (old_var + eps)))
    return RecalibratedLayer(
        name=name,
        channels=int(old_mean.shape[0]),
        max_mean_shift=float(shift.max()),
        max_abs_log_var_ratio=float(ratio.max()),
    )


def recalibrate(
    model: Any, batches: Any, *, batch_size: int | None = None, variance_estimator: str = "unbiased"
) -> tuple[Any, RecalibrationReport]:
    """Re-estimate every BatchNorm's running statistics on `batches`; returns (new model, report).
    The input model is not modified.

    Args:
        model: torch.nn.Module, torch ExportedProgram, keras.Model or onnx.ModelProto.
        batches: a list of batches (arrays, or tuples of arrays for several inputs), or data to split
            into batches of `batch_size` (an array, a .npy/.npz path, a Sample).
        batch_size: inputs per forward pass (memory only; a model with a fixed batch size gets batches of that size).
        variance_estimator: "unbiased" (PyTorch's running_var: the population variance times n / (n - 1)) or "biased"
            (the population variance itself).
    """
    if variance_estimator not in ("unbiased", "biased"):
        raise InputFileError(
            f"variance_estimator '{variance_estimator}' is unknown; pass 'unbiased' (PyTorch) or 'biased' (Keras, ONNX)."
        )
    adapter = REGISTRY.model_adapter_of(model)
    split = _as_batches(model, batches, batch_size)
    if not split:
        raise InputFileError("no batches given; pass at least one batch of new data.")
    samples = sum(int(b[0].shape[0]) for b in split)
    notes = _batch_size_notes(model, batches, batch_size or DEFAULT_BATCH_SIZE)
    new_model, moved, method = adapter.recalibrate(model, split, variance_estimator)
    layers = [_movement(*entry) for entry in moved]
    if not layers:
        raise UnsupportedObjectError(
            f"{describe(model)} has no BatchNorm layer with running statistics to recalibrate."
        )
    report = RecalibrationReport(
        model=describe(model),
        framework=adapter.framework,
        method=method,
        batches=len(split),
        samples=samples,
        variance_estimator=variance_estimator,
        layers=layers,
        notes=notes,
    )
    return new_model, report


def _batch_size_notes(model: Any, batches: Any, asked: int) -> list[str]:
    """Say so when the forward passes took another batch size than asked (a model exported with a fixed batch size takes
    no other); the statistics do not depend on it."""
    if _given_as_batches(batches):
        return []
    fixed = fixed_batch_size(model)
    if fixed is None or fixed == asked:
        return []
    return [
        f"the model accepts batches of exactly {fixed}, so the forward passes took {fixed} samples each, not {asked}; the statistics "
        "are pooled over all samples either way."
    ]


def save_recalibrated(model: Any, path) -> None:
    """Write a recalibrated .onnx, .pt2 or .keras model atomically."""
    from pathlib import Path

    REGISTRY.model_adapter_of(model).save(model, Path(path))


__all__ = ["population_statistics", "recalibrate", "save_recalibrated"]
