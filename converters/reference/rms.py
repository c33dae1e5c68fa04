"""RMSNorm reference: x / sqrt(mean(x^2) + eps) * scale over trailing axes (or the channel axis)."""

from __future__ import annotations

import numpy as np

from ._affine import affine
from .layer import normalised_axes
from .precision import in_compute


def forward(spec, x: np.ndarray, training: bool) -> np.ndarray:
    axes, shape = normalised_axes(spec, x)
    mean_square = in_compute(spec, np.mean(x * x, axis=axes, keepdims=True))
    return affine(spec, x / np.sqrt(mean_square + spec.eps), shape)
