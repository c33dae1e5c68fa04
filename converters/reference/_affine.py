"""Normalisation plus affine, shared by every kind's reference (precision.py says where values are rounded)."""

from __future__ import annotations

import numpy as np

from .precision import affine_dtype, in_compute, round_to, rounds


def affine(spec, normalized: np.ndarray, broadcast_shape: tuple[int, ...]) -> np.ndarray:
    """Apply `scale_offset + scale` and bias (when the spec has them), reshaped to `broadcast_shape`,
    then cast to dtype.

    The offset is added in the affine dtype as GemmaRMSNorm does (`1.0 + weight.float()`).
    """
    out = in_compute(spec, normalized)
    step = (lambda v: round_to(v, affine_dtype(spec))) if rounds(spec) else (lambda v: v)
    out = step(out)  # the cast before the affine (a no-op unless cast_before_affine)
    if spec.scale:
        factor = spec.tensors["scale"].astype(np.float64).reshape(broadcast_shape)
        if spec.scale_offset:
            factor = step(factor + spec.scale_offset)
        out = step(out * factor)
    if spec.bias:
        out = step(out + spec.tensors["bias"].astype(np.float64).reshape(broadcast_shape))
    return round_to(out, spec.dtype) if rounds(spec) else out


def channel_shape(x: np.ndarray) -> tuple[int, ...]:
    """Broadcast shape of a per-channel vector against channels-first `x`."""
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def normalize(x: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float, spec=None) -> np.ndarray:
    """(x - mean) / sqrt(var + eps), with the statistics stored in the compute dtype when `spec` rounds."""
    if spec is not None:
        mean, var = in_compute(spec, mean), in_compute(spec, var)
    return (x - mean) / np.sqrt(var + eps)
