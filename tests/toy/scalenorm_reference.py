"""ScaleNorm's NumPy reference, as a `converters/reference/<kind>.py` module holds it (float64)."""

from __future__ import annotations

import numpy as np


def forward(spec, x: np.ndarray, training: bool) -> np.ndarray:
    norm = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
    y = x / np.maximum(norm, spec.eps)
    return y * spec.tensors["scale"].astype(np.float64) if spec.scale else y
