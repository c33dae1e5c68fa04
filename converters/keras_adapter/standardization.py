"""keras.layers.Normalization: a frozen standardisation, (x - mean) / max(sqrt(variance), epsilon), read and reported.

Its mean and variance are statistics of the training data (set by `adapt()` or given), frozen:
the very state a registry of normalization state must see, and which drifts as BatchNorm's does.
Its epsilon rule is its own (keras/src/layers/preprocessing/normalization.py): a floor on the
standard deviation, `keras.backend.epsilon()` (1e-7 by default), not a term added to the variance.
No normalizer kind computes that, so the layer is not converted on its own (a BatchNorm would
divide by sqrt(variance + eps), which differs wherever the variance is near zero and is not
bit-exact elsewhere); a whole-model ONNX export keeps it exactly, as the Sub, Sqrt, Max and Div
Keras traces, with the statistics as constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.inspection import Hazard

from .keras_internals import all_layers
from .runtime import import_keras

CODE = "frozen_standardization"


@dataclass(frozen=True)
class Standardization:
    """One keras.layers.Normalization: its kept axes, statistics (broadcast to the input) and epsilon floor."""

    name: str
    axis: tuple[int, ...]
    mean: np.ndarray
    variance: np.ndarray
    epsilon: float
    invert: bool

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The layer's output in float64 (the oracle the tests compare Keras and onnxruntime with)."""
        std = np.maximum(np.sqrt(self.variance.astype(np.float64)), self.epsilon)
        mean = self.mean.astype(np.float64)
        return mean + x * std if self.invert else (np.asarray(x, dtype=np.float64) - mean) / std


def is_standardization(layer: Any) -> bool:
    return isinstance(layer, import_keras().layers.Normalization)


def read_standardization(layer: Any) -> Standardization | None:
    """The layer's frozen statistics, or None while it is not built (it holds none yet)."""
    if not layer.built or getattr(layer, "mean", None) is None:
        return None
    keras = import_keras()
    return Standardization(
        name=layer.name,
        axis=tuple(layer.axis),
        mean=np.asarray(keras.ops.convert_to_numpy(layer.mean)),
        variance=np.asarray(keras.ops.convert_to_numpy(layer.variance)),
        epsilon=float(keras.backend.epsilon()),
        invert=bool(layer.invert),
    )


def refusal(layer: Any) -> str:
    """Why the layer is not converted on its own (one sentence, for UnsupportedObjectError)."""
    return (
        f"keras.layers.Normalization '{layer.name}' is a frozen standardisation, (x - mean) / max(sqrt(variance), epsilon) with "
        "epsilon a floor on the standard deviation (keras.backend.epsilon()), which no PyTorch or ONNX normalization layer computes "
        "exactly; it is listed by inspect with its statistics and kept exactly by a whole-model ONNX export (normbridge export)."
    )


def _summary(values: np.ndarray) -> str:
    flat = np.asarray(values, dtype=np.float64).ravel()
    if flat.size <= 4:
        return "[" + ", ".join(f"{v:.6g}" for v in flat) + "]"
    return f"{flat.size} values in [{flat.min():.6g}, {flat.max():.6g}], mean {flat.mean():.6g}"


def standardization_hazards(model: Any) -> list[Hazard]:
    """One entry per keras.layers.Normalization of `model`: its statistics,
    and a warning when they were never adapted."""
    layers = all_layers(model) if isinstance(model, import_keras().layers.Layer) else []
    found = []
    for layer in layers:
        if not is_standardization(layer):
            continue
        state = read_standardization(layer)
        if state is None:
            found.append(
                Hazard(
                    code=CODE,
                    severity="warning",
                    message=f"keras.layers.Normalization '{layer.name}' is not built: it holds no statistics yet.",
                )
            )
            continue
        fresh = bool(np.all(state.mean == 0) and np.all(state.variance == 1))
        what = (
            "inverse standardisation, mean + x * max(sqrt(variance), epsilon)"
            if state.invert
            else "standardisation, (x - mean) / max(sqrt(variance), epsilon)"
        )
        message = (
            f"keras.layers.Normalization '{layer.name}' is a frozen {what} over axis {list(state.axis)}: mean {_summary(state.mean)}, "
            f"variance {_summary(state.variance)}, epsilon {state.epsilon!r} (a floor on the standard deviation); these are statistics "
            "of the training data and drift like BatchNorm's. It is not converted on its own (no normalizer kind computes it); "
            "a whole-model ONNX export keeps it exactly."
        )
        if fresh:
            message += " Its statistics are still mean 0, variance 1: it was never adapted (adapt() or mean=/variance=), so it passes inputs through."
        found.append(Hazard(code=CODE, severity="warning" if fresh else "info", message=message))
    return found
