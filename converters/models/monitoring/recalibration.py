"""Recalibration: re-estimate BatchNorm running statistics on new data, weights untouched.

The new statistics are PyTorch's cumulative average (momentum=None) over the given batches:
running_mean = mean over batches of the batch mean, running_var = mean over batches of the
unbiased batch variance, each batch weighted equally, with every BatchNorm normalizing by its
batch statistics during the pass (as in training). Other layers run in eval mode (no dropout),
no gradient is computed and nothing but the running statistics changes.

Each framework's method is its model adapter's (ModelAdapter.recalibrate):

- torch.nn.Module: PyTorch itself does it, on a deep copy: reset_running_stats, momentum=None,
  BatchNorm layers in train mode; afterwards each layer's momentum and every module's mode are
  restored.
- ExportedProgram (.pt2): an FX interpreter runs the program with batch statistics and records
  each BatchNorm input; the averages are computed in float64 and rounded once to float32 into a
  copy of the program's state dict. The graph is unchanged, so the program stays what it was
  with new buffers; PyTorch's own incremental float32 average agrees to float32 rounding.
- ONNX: a copy with every BatchNormalization in training_mode=1 exposes each node's input as
  a graph output in onnxruntime; the averages replace the node's mean and variance initializers.
- Keras: Keras's own update, with momentum (k-1)/k on the k-th batch (the cumulative average).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas import InputFileError, UnsupportedObjectError
from schemas.serving import RecalibratedLayer, RecalibrationReport

from ...adapters import REGISTRY
from ...model_values import cumulative_statistics
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
    old_mean, old_var, new_mean, new_var = (np.asarray(a, dtype=np.float64) for a in (old_mean, old_var, new_mean, new_var))
    shift = np.abs(new_mean - old_mean) / np.sqrt(old_var + eps)
    ratio = np.abs(np.log((new_var + eps) / (old_var + eps)))
    return RecalibratedLayer(name=name, channels=int(old_mean.shape[0]), max_mean_shift=float(shift.max()), max_abs_log_var_ratio=float(ratio.max()))


def recalibrate(model: Any, batches: Any, *, batch_size: int | None = None, variance_estimator: str = "unbiased") -> tuple[Any, RecalibrationReport]:
    """Re-estimate every BatchNorm's running statistics on `batches`; returns (new model, report). The input model is not modified.

    Args:
        model: torch.nn.Module, torch ExportedProgram, keras.Model or onnx.ModelProto.
        batches: a list of batches (arrays, or tuples of arrays for several inputs), or data to split
            into batches of `batch_size` (an array, a .npy/.npz path, a Sample).
        variance_estimator: "unbiased" (PyTorch) or "biased" (Keras/ONNX training); not for an nn.Module (PyTorch's own is unbiased).
    """
    if variance_estimator not in ("unbiased", "biased"):
        raise InputFileError(f"variance_estimator '{variance_estimator}' is unknown; pass 'unbiased' (PyTorch) or 'biased' (Keras, ONNX).")
    adapter = REGISTRY.model_adapter_of(model)
    split = _as_batches(model, batches, batch_size)
    if not split:
        raise InputFileError("no batches given; pass at least one batch of new data.")
    samples = sum(int(b[0].shape[0]) for b in split)
    notes = _batch_size_notes(model, batches, batch_size or DEFAULT_BATCH_SIZE)
    new_model, moved, method = adapter.recalibrate(model, split, variance_estimator)
    layers = [_movement(*entry) for entry in moved]
    if not layers:
        raise UnsupportedObjectError(f"{describe(model)} has no BatchNorm layer with running statistics to recalibrate.")
    report = RecalibrationReport(model=describe(model), framework=adapter.framework, method=method, batches=len(split), samples=samples,
                                 variance_estimator=variance_estimator, layers=layers, notes=notes)
    return new_model, report


def _batch_size_notes(model: Any, batches: Any, asked: int) -> list[str]:
    """Say so when the data was split into batches of another size than asked: a model exported with a fixed batch size
    takes no other, and the cumulative average of per-batch variances depends on the batch size."""
    if _given_as_batches(batches):
        return []
    fixed = fixed_batch_size(model)
    if fixed is None or fixed == asked:
        return []
    return [f"the model accepts batches of exactly {fixed}, so the data was split into batches of {fixed}, not {asked}: the running "
            f"variances average per-batch variances of {fixed} samples (export the model with a dynamic batch axis to choose)."]


def save_recalibrated(model: Any, path) -> None:
    """Write a recalibrated .onnx, .pt2 or .keras model atomically."""
    from pathlib import Path

    REGISTRY.model_adapter_of(model).save(model, Path(path))


__all__ = ["cumulative_statistics", "recalibrate", "save_recalibrated"]
