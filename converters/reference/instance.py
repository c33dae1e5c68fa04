"""InstanceNorm reference: per-(sample, channel) statistics; tracked running statistics at eval."""

from __future__ import annotations

import numpy as np

from ._affine import affine, channel_shape, normalize


def batch_moments(x: np.ndarray):
    """What tracked statistics are updated with: the batch mean of per-instance mean and variance.

    PyTorch folds the batch into channels and averages the per-instance updates (see
    torch.nn.functional.instance_norm), so the count per statistic is the spatial size.
    """
    axes = tuple(range(2, x.ndim))
    count = int(np.prod(x.shape[2:]))
    return x.mean(axis=axes).mean(axis=0), x.var(axis=axes).mean(axis=0), count


def forward(spec, x: np.ndarray, training: bool) -> np.ndarray:
    shape = channel_shape(x)
    if spec.track_running_stats and (spec.frozen or not training):
        mean = spec.tensors["running_mean"].astype(np.float64).reshape(shape)
        var = spec.tensors["running_var"].astype(np.float64).reshape(shape)
    else:
        axes = tuple(range(2, x.ndim))
        mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    return affine(spec, normalize(x, mean, var, spec.eps, spec), shape)
