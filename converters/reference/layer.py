"""LayerNorm reference: statistics per sample over the trailing normalized_shape axes (or the channel axis)."""

from __future__ import annotations

import numpy as np

from ._affine import affine, channel_shape, normalize


def normalised_axes(spec, x: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(axes reduced over, broadcast shape of scale and bias): the trailing axes,
    or axis 1 with a channels_first layout."""
    if spec.layout == "channels_first":
        return (1,), channel_shape(x)
    return tuple(range(x.ndim - len(spec.normalized_shape), x.ndim)), tuple(spec.normalized_shape)


def forward(spec, x: np.ndarray, training: bool) -> np.ndarray:
    axes, shape = normalised_axes(spec, x)
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    return affine(spec, normalize(x, mean, var, spec.eps, spec), shape)
