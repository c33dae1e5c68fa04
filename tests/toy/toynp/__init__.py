"""toynp: a "framework" of two NumPy layers, each computing in float64 and answering float32, kept in eval mode."""

from __future__ import annotations

import numpy as np

__version__ = "0.1"


class LayerNorm:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing `shape` axes."""

    def __init__(
        self,
        shape: tuple[int, ...],
        eps: float = 1e-5,
        weight=None,
        bias=None,
        name: str = "norm",
        training: bool = False,
    ):
        self.shape, self.eps, self.name, self.training = tuple(shape), eps, name, training
        self.weight = None if weight is None else np.array(weight, dtype=np.float32)
        self.bias = None if bias is None else np.array(bias, dtype=np.float32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        axes = tuple(range(-len(self.shape), 0))
        mean = x.mean(axis=axes, keepdims=True)
        y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.astype(np.float32)


class ScaleNorm:
    """weight * x / max(||x||_2, eps) over the last axis."""

    def __init__(self, size: int, eps: float = 1e-5, weight=None, name: str = "norm", training: bool = False):
        self.size, self.eps, self.name, self.training = size, eps, name, training
        self.weight = None if weight is None else np.array(weight, dtype=np.float32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        y = x / np.maximum(np.sqrt((x * x).sum(axis=-1, keepdims=True)), self.eps)
        return (y if self.weight is None else y * self.weight).astype(np.float32)
