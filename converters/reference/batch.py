"""BatchNorm reference: running statistics at eval, biased batch statistics in training."""

from __future__ import annotations

import numpy as np

from ._affine import affine, channel_shape, normalize


#: The last input's moments, by its dtype, shape and bytes: a check asks for the moments of one probe up to nine times
#: per layer (each training step's forward and update, each target's), and check_many for every layer of a
#: configuration.
_LAST: dict[tuple, tuple] = {}


def batch_moments(x: np.ndarray):
    """Per-channel mean and biased variance over batch and spatial axes, and the count (read-only arrays)."""
    key = (x.dtype.str, x.shape, x.tobytes())
    found = _LAST.get(key)
    if found is None:
        axes = (0,) + tuple(range(2, x.ndim))
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        mean.setflags(write=False)
        var.setflags(write=False)
        found = (mean, var, x.size // x.shape[1])
        _LAST.clear()
        _LAST[key] = found
    return found


def forward(spec, x: np.ndarray, training: bool) -> np.ndarray:
    shape = channel_shape(x)
    if spec.track_running_stats and (spec.frozen or not training):  # frozen: running statistics in training mode too
        mean = spec.tensors["running_mean"].astype(np.float64)
        var = spec.tensors["running_var"].astype(np.float64)
    else:
        mean, var, _ = batch_moments(x)
    return affine(spec, normalize(x, mean.reshape(shape), var.reshape(shape), spec.eps, spec), shape)
