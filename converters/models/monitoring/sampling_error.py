"""How far a window's statistics may stray from its traffic's by chance, and the rule that alarms only beyond that.

A window holds the mean and variance of a sample of traffic, not of the traffic itself: a small window of traffic whose
true shift is 0.45 can read 0.58 on some channel and cross the 0.5 threshold by chance alone. So a channel counts as
over only when its statistic exceeds the threshold by more than `m` of its standard errors:

    shift - m * se_shift > shift threshold,      |log ratio| - m * se_log_ratio > log_ratio threshold,

with se_shift = se(mean) / sqrt(running_var + eps) and se_log_ratio = se(var) / (var + eps) (the delta method). The
standard errors come from the window's batches: the collector merges one batch per observed request, and the spread of
the batch means (and second moments) around the window's gives the cluster-robust ("sandwich") standard error of the
pooled mean and variance (window.py). Values inside one input are correlated (neighbouring positions of a feature map,
and a fixed pattern over positions), so the standard error computed from `count` as if they were independent is off by a
factor of 0.45 to 2.2 on the layers of a small ResNet; the batches measure it instead. With B batches, the standard
error is known to B - 1 degrees of freedom, so `m` is Student's t quantile at 1 - false_alarm / (2 * channels) with B -
1 degrees of freedom: a layer whose every channel sits exactly at a threshold alarms in at most `false_alarm` of windows
(a Bonferroni bound over the layer's 2 * channels one-sided tests), and one further below alarms less. A window that
carries no batches (a hand-written client) gets standard errors from `count` as for independent values (normal data:
se(var) = var * sqrt(2 / count)) and the normal quantile; a layer observed in one batch only cannot alarm, since its
sampling error cannot be measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

#: Above this many degrees of freedom Student's t is the normal distribution to 0.2% of the quantile
#: (t - z ~ z^3 / 4df).
_NORMAL_DF = 100_000


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes, 6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d, c = 1.0 + aa * d, 1.0 + aa / c
        d, c = 1.0 / (d if abs(d) > tiny else tiny), (c if abs(c) > tiny else tiny)
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d, c = 1.0 + aa * d, 1.0 + aa / c
        d, c = 1.0 / (d if abs(d) > tiny else tiny), (c if abs(c) > tiny else tiny)
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _continued_fraction(a, b, x) / a
    return 1.0 - front * _continued_fraction(b, a, 1.0 - x) / b


def t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom, t >= 0."""
    return 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The t with P(T > t) = p (0 < p < 0.5): Student's t upper quantile, by bisection on the tail
    (relative error 1e-12)."""
    if df >= _NORMAL_DF:
        return NormalDist().inv_cdf(1.0 - p)
    low, high = 0.0, 1.0
    while t_upper_tail(high, df) > p:
        low, high = high, high * 2.0
    while high - low > 1e-12 * high:
        middle = (low + high) / 2.0
        low, high = (middle, high) if t_upper_tail(middle, df) > p else (low, middle)
    return high


def error_multiplier(channels: int, batches: int | None, false_alarm: float) -> float | None:
    """How many standard errors a channel's statistic must clear its threshold by, for a layer of `channels` channels
    whose standard errors were measured on `batches` batches (None: computed from the count, the normal quantile); None
    when one batch cannot measure them."""
    p = false_alarm / (2.0 * channels)
    if batches is None:
        return NormalDist().inv_cdf(1.0 - p)
    if batches < 2:
        return None
    return t_quantile(p, float(batches - 1))


def count_errors(count: int, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(se of the mean, se of the variance) of `count` independent values of normal data with variance `var`."""
    var = np.asarray(var, dtype=np.float64)
    return np.sqrt(var / count), var * math.sqrt(2.0 / count)


@dataclass(frozen=True)
class Judged:
    """One layer of a window against the thresholds, beyond its sampling error."""

    shift_bound: float | None  # max over channels of shift - m * se_shift; None when the error cannot be measured
    log_ratio_bound: float | None  # max over channels of |log ratio| - m * se_log_ratio
    multiplier: float | None  # m
    over: bool


def judge_layer(
    shift: np.ndarray,
    log_ratio: np.ndarray,
    var,
    running_var,
    eps: float,
    count: int,
    batches: int | None,
    se_mean,
    se_var,
    shift_threshold: float,
    log_ratio_threshold: float,
    false_alarm: float,
) -> Judged:
    """Whether a layer's window is over a threshold by more than its sampling error (see the module docstring).

    `shift` and `log_ratio` are per channel (channel_shift), `var` the window's variance, `se_mean`/`se_var` the
    standard errors the window carries (None: from `count`)."""
    multiplier = error_multiplier(len(shift), batches, false_alarm)
    if multiplier is None:
        return Judged(None, None, None, False)
    var = np.asarray(var, dtype=np.float64)
    if se_mean is None or se_var is None:
        se_mean, se_var = count_errors(count, var)
    se_shift = np.asarray(se_mean, dtype=np.float64) / np.sqrt(np.asarray(running_var, dtype=np.float64) + eps)
    se_log_ratio = np.asarray(se_var, dtype=np.float64) / (var + eps)
    shift_bound = float((shift - multiplier * se_shift).max())
    log_ratio_bound = float((np.abs(log_ratio) - multiplier * se_log_ratio).max())
    return Judged(
        shift_bound, log_ratio_bound, multiplier, shift_bound > shift_threshold or log_ratio_bound > log_ratio_threshold
    )


__all__ = ["Judged", "count_errors", "error_multiplier", "judge_layer", "t_quantile", "t_upper_tail"]
