"""GroupNorm reference: statistics per (sample, group) over the group's channels and spatial axes."""

from __future__ import annotations

import numpy as np

from ._affine import affine, channel_shape, normalize


def forward(spec, x: np.ndarray, training: bool) -> np.ndarray:
    n, c = x.shape[:2]
    grouped = x.reshape((n, spec.num_groups, c // spec.num_groups) + x.shape[2:])
    axes = tuple(range(2, grouped.ndim))
    mean, var = grouped.mean(axis=axes, keepdims=True), grouped.var(axis=axes, keepdims=True)
    normalized = normalize(grouped, mean, var, spec.eps, spec).reshape(x.shape)
    return affine(spec, normalized, channel_shape(x))
