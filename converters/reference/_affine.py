"""Normalisation plus affine, shared by every kind's reference."""

from __future__ import annotations

import numpy as np


def affine(spec, normalized: np.ndarray, broadcast_shape: tuple[int, ...]) -> np.ndarray:
    """Apply scale and bias (when the spec has them), reshaped to `broadcast_shape`."""
    out = normalized
    if spec.scale:
        # The affine factor is scale_offset + scale (Gemma keeps its weight as an offset from 1).
        factor = getattr(spec, "scale_offset", 0.0) + spec.tensors["scale"].astype(np.float64)
        out = out * factor.reshape(broadcast_shape)
    if spec.bias:
        out = out + spec.tensors["bias"].astype(np.float64).reshape(broadcast_shape)
    return out


def channel_shape(x: np.ndarray) -> tuple[int, ...]:
    """Broadcast shape of a per-channel vector against channels-first `x`."""
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def normalize(x: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float) -> np.ndarray:
    return (x - mean) / np.sqrt(var + eps)
