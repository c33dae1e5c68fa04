"""RMSNorm reference: x / sqrt(mean(x^2) + eps) * scale over trailing axes."""

from __future__ import annotations

import numpy as np

from ._affine import affine


def forward(spec, x: np.ndarray, training: bool) -> np.ndarray:
    axes = tuple(range(x.ndim - len(spec.normalized_shape), x.ndim))
    mean_square = np.mean(x * x, axis=axes, keepdims=True)
    return affine(spec, x / np.sqrt(mean_square + spec.eps), tuple(spec.normalized_shape))
