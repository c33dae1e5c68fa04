"""BatchNorm reference: running statistics at eval, biased batch statistics in training."""

from __future__ import annotations

import numpy as np

from ._affine import affine, channel_shape, normalize


def batch_moments(x: np.ndarray):
    """Per-channel mean and biased variance over batch and spatial axes, and the count."""
    axes = (0,) + tuple(range(2, x.ndim))
    count = x.size // x.shape[1]
    return x.mean(axis=axes), x.var(axis=axes), count


def forward(spec, x: np.ndarray, training: bool) -> np.ndarray:
    shape = channel_shape(x)
    if spec.track_running_stats and (spec.frozen or not training):  # frozen: running statistics in training mode too
        mean = spec.tensors["running_mean"].astype(np.float64)
        var = spec.tensors["running_var"].astype(np.float64)
    else:
        mean, var, _ = batch_moments(x)
    return affine(spec, normalize(x, mean.reshape(shape), var.reshape(shape), spec.eps, spec), shape)
