"""LayerNorm reference: statistics per sample over the trailing normalized_shape axes."""

from __future__ import annotations

import numpy as np

from ._affine import affine, normalize


def forward(spec, x: np.ndarray, training: bool) -> np.ndarray:
    axes = tuple(range(x.ndim - len(spec.normalized_shape), x.ndim))
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    return affine(spec, normalize(x, mean, var, spec.eps), tuple(spec.normalized_shape))
