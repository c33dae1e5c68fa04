"""Why a BatchNorm layer alarms: its input moved, or its running statistics never converged.

BatchNorm starts from running_mean 0 and running_var 1 and moves them by `momentum` per training
batch, so after t batches a share w = (1 - momentum) ** t of those initial values is left:
running_mean = (1 - w) * mu, running_var = w + (1 - w) * sigma^2. A model trained for 10 steps at
momentum 0.1 keeps w = 0.35; its statistics match no input, even one from the training
distribution. We tell the two apart by bias correction (as Adam corrects its moments):
mu = running_mean / (1 - w), sigma^2 = (running_var - w) / (1 - w). When the layer alarms against
its stored statistics but not against the corrected ones, the input did not move: the statistics
are `unconverged_statistics`.

w comes from num_batches_tracked and momentum where the model keeps them (torch modules and
programs). Where it does not (ONNX, Keras), w is fitted: the statistics are called unconverged only
when some w >= FITTED_FLOOR explains the alarm (corrected score within the thresholds and at most
half the uncorrected one). Statistics that are exactly mean 0 / variance 1 are the initial values:
such a layer never tracked a batch, alarm or not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schemas.serving import DriftThresholds

#: Below this share of initial values left, the statistics count as converged (0.9 ** 29 < 0.05).
INITIAL_WEIGHT_FLOOR = 0.05
#: A fitted share (no batch counter to go by) must be at least this before it explains an alarm.
FITTED_FLOOR = 0.2
_FIT_GRID = np.round(np.arange(FITTED_FLOOR, 0.96, 0.01), 2)


@dataclass(frozen=True)
class Convergence:
    """The verdict on one layer's statistics: status, the evidence in words, and the share of initial values left."""

    status: str  # ok, drift or unconverged_statistics
    reason: str | None = None
    initial_weight: float | None = None


def initial_weight(batches_tracked: int | None, momentum: float | None) -> float | None:
    """(1 - momentum) ** batches_tracked; 1.0 before any batch; None when unknown or for a cumulative average
    (momentum 0/None)."""
    if batches_tracked is None:
        return None
    if batches_tracked <= 0:
        return 1.0
    if momentum is None or momentum <= 0.0 or momentum >= 1.0:
        # torch's momentum=None (cumulative average) forgets the initial values at the first batch; unknown otherwise
        return None
    return float((1.0 - momentum) ** batches_tracked)


def is_initial(running_mean: np.ndarray, running_var: np.ndarray) -> bool:
    """Whether the statistics are exactly BatchNorm's initial values (every mean 0, every variance 1)."""
    return bool(np.all(running_mean == 0.0) and np.all(running_var == 1.0))


def score(
    mean: np.ndarray,
    var: np.ndarray,
    running_mean: np.ndarray,
    running_var: np.ndarray,
    eps: float,
    thresholds: DriftThresholds,
) -> float:
    """The worst channel's statistic over its threshold (above 1 alarms); infinity for a non-positive variance."""
    if np.any(running_var + eps <= 0.0):
        return float("inf")
    shift = np.abs(mean - running_mean) / np.sqrt(running_var + eps)
    log_ratio = np.abs(np.log((var + eps) / (running_var + eps)))
    return float(max(shift.max() / thresholds.shift, log_ratio.max() / thresholds.log_ratio))


def corrected(running_mean: np.ndarray, running_var: np.ndarray, weight: float) -> tuple[np.ndarray, np.ndarray]:
    """The statistics with a share `weight` of the initial (0, 1) values taken out."""
    return running_mean / (1.0 - weight), (running_var - weight) / (1.0 - weight)


def judge(
    mean,
    var,
    running_mean,
    running_var,
    eps: float,
    thresholds: DriftThresholds,
    alarm: bool,
    batches_tracked: int | None = None,
    momentum: float | None = None,
) -> Convergence:
    """ok, drift or unconverged_statistics for one layer whose input had per-channel `mean` and `var`."""
    if is_initial(running_mean, running_var):
        return Convergence(
            "unconverged_statistics",
            "running statistics are exactly their initial values (mean 0, variance 1): "
            f"the layer never tracked a batch (num_batches_tracked={_count(batches_tracked)})",
            1.0,
        )
    if not alarm:
        return Convergence("ok", initial_weight=initial_weight(batches_tracked, momentum))
    raw = score(mean, var, running_mean, running_var, eps, thresholds)
    known = initial_weight(batches_tracked, momentum)
    if known is not None:
        if known < INITIAL_WEIGHT_FLOOR or known >= 1.0:
            return Convergence("drift", initial_weight=known)
        fixed = score(mean, var, *corrected(running_mean, running_var, known), eps, thresholds)
        if fixed <= 1.0:
            return Convergence(
                "unconverged_statistics",
                f"num_batches_tracked={batches_tracked} at momentum {momentum:g} leaves "
                f"{known:.0%} of the initial values in the running statistics; against the bias-corrected statistics "
                f"the input is within the thresholds (score {fixed:.2f} of 1, uncorrected {raw:.2f})",
                known,
            )
        return Convergence("drift", initial_weight=known)
    scores = [score(mean, var, *corrected(running_mean, running_var, w), eps, thresholds) for w in _FIT_GRID]
    best = int(np.argmin(scores))
    if scores[best] <= 1.0 and scores[best] <= raw / 2.0:
        weight = float(_FIT_GRID[best])
        return Convergence(
            "unconverged_statistics",
            f"the running statistics read as {weight:.0%} initial values (mean 0, variance 1) "
            f"blended with the input's own (no batch counter in this format): corrected, the input is within the "
            f"thresholds (score {scores[best]:.2f} of 1, uncorrected {raw:.2f})",
            weight,
        )
    return Convergence("drift")


def _count(batches_tracked: int | None) -> str:
    return "not kept in this format" if batches_tracked is None else str(batches_tracked)


def blamed_on_unconverged(layers) -> tuple[str | None, list[int]]:
    """The first unconverged layer (execution order) and the indices of the later drifting layers it explains.

    In eval mode an unconverged BatchNorm normalizes with statistics its training batches never had, so every later
    layer sees inputs unlike its training inputs although the served input did not move. A later layer whose own
    statistics are known converged (its batch counter says so) drifted for itself and is not blamed. `layers` are
    anything with `name`, `status` and `initial_weight` (the offline report's layers, the history's layer summaries)."""
    first = next((i for i, layer in enumerate(layers) if layer.status == "unconverged_statistics"), None)
    if first is None:
        return None, []
    return layers[first].name, [
        i
        for i, layer in enumerate(layers)
        if i > first
        and layer.status == "drift"
        and not (layer.initial_weight is not None and layer.initial_weight < INITIAL_WEIGHT_FLOOR)
    ]


__all__ = [
    "Convergence",
    "FITTED_FLOOR",
    "INITIAL_WEIGHT_FLOOR",
    "blamed_on_unconverged",
    "corrected",
    "initial_weight",
    "is_initial",
    "judge",
    "score",
]
