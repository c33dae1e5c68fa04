"""Independent NumPy reference of every kind: the oracle the tests and `check` compare against.

All functions take channels-first input for the channel kinds (use `layout.to_channels_first`)
and compute in float64, rounding at tensor boundaries for bf16/fp16 layers and explicit compute
dtypes (`precision.py`). A `frozen` spec uses its running statistics in training mode too, and a
training step leaves them unchanged. One module per kind, `reference/<kind>.py`,
with `forward(spec, x, training)` and, for kinds with running statistics, `batch_moments(x)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

import numpy as np

from schemas.kinds import KIND_INFO

from .precision import in_compute

#: kind -> its reference module, one per kind of the vocabulary (a missing one fails this import, naming it).
KIND_MODULES = {kind: import_module(f"{__name__}.{kind}") for kind in KIND_INFO}


def register_kind(kind: str, module) -> None:
    """The reference of a kind added at run time (converters.adapters.REGISTRY.add_kind): `module` holds
    forward(spec, x, training) and, for a kind with running statistics, batch_moments(x), as `<kind>.py` here does."""
    if kind in KIND_MODULES:
        raise ValueError(f"kind '{kind}' has a reference already.")
    KIND_MODULES[kind] = module


def remove_kind(kind: str) -> None:
    """Take the reference of a kind added at run time out again."""
    KIND_MODULES.pop(kind, None)


@dataclass(frozen=True)
class TrainStep:
    """Output and updated statistics after one training-mode forward pass."""

    output: np.ndarray
    running_mean: np.ndarray | None
    running_var: np.ndarray | None
    num_batches_tracked: int | None


def forward(spec, x: np.ndarray, training: bool | None = None) -> np.ndarray:
    """Output of the layer described by `spec` on `x` (float64). `training` defaults to spec.training."""
    mode = spec.training if training is None else training
    return KIND_MODULES[spec.kind].forward(spec, _input(spec, x), mode)


def _input(spec, x: np.ndarray) -> np.ndarray:
    """`x` in float64 as the layer sees it: cast to its compute dtype (exact when that is wider)."""
    return in_compute(spec, np.asarray(x, dtype=np.float64))


def train_step(spec, x: np.ndarray, variance_estimator: str | None = None) -> TrainStep:
    """One training-mode step; `variance_estimator` overrides the spec's (to predict another framework)."""
    x = _input(spec, x)
    y = KIND_MODULES[spec.kind].forward(spec, x, True)
    if not spec.track_running_stats:
        return TrainStep(y, None, None, None)
    if spec.frozen:
        # FrozenBatchNorm2d: constants, no momentum, no counter: the step changes nothing.
        count = int(spec.tensors["num_batches_tracked"]) if "num_batches_tracked" in spec.tensors else None
        return TrainStep(
            y, spec.tensors["running_mean"].astype(np.float64), spec.tensors["running_var"].astype(np.float64), count
        )
    estimator = variance_estimator or spec.variance_estimator
    batch_mean, batch_var_biased, count = batch_moments(spec, x)
    batch_var = batch_var_biased * count / (count - 1) if estimator == "unbiased" else batch_var_biased
    old_mean = spec.tensors["running_mean"].astype(np.float64)
    old_var = spec.tensors["running_var"].astype(np.float64)
    nbt = int(spec.tensors["num_batches_tracked"]) if "num_batches_tracked" in spec.tensors else 0
    nbt += 1
    weight = 1.0 / nbt if spec.momentum is None else spec.momentum_as("batch_weight")
    new_mean = (1.0 - weight) * old_mean + weight * batch_mean
    new_var = (1.0 - weight) * old_var + weight * batch_var
    return TrainStep(y, new_mean, new_var, nbt)


def batch_moments(spec, x: np.ndarray):
    """Per-channel mean, biased variance and count of `x` as the kind's running statistics see them."""
    return KIND_MODULES[spec.kind].batch_moments(np.asarray(x, dtype=np.float64))


def estimator_gap(spec, x: np.ndarray) -> float:
    """Max |running_var(unbiased) - running_var(biased)| after one step: what the estimators disagree by."""
    if not spec.track_running_stats:
        return 0.0
    a = train_step(spec, x, "unbiased").running_var
    b = train_step(spec, x, "biased").running_var
    return float(np.max(np.abs(a - b)))
