"""One statistics window of the serving collector: per layer, per channel, a streaming count, mean and M2.

Each sampled request's batch moments are merged in with Chan, Golub and LeVeque's pairwise update (the parallel form
of Welford's), which is exact in float64 whatever the order and sizes of the batches:
n = na + nb, d = mb - ma, mean = ma + d * nb / n, M2 = M2a + M2b + d^2 * na * nb / n; the population variance is M2 / n.
The merged window equals LayerMoments.pooled() over the same batches (tests/converters/models check both against NumPy).
A torch tap hands over a batch's per-channel sum and sum of squares instead (two plain reductions, far cheaper on the
request thread than torch.var_mean); `merge_sums` turns them into the batch's mean and variance in float64 first.

Each merge is one batch (one observed request's input to the layer), so the window also measures its own sampling
error from the spread of its batches (sampling_error.py): the cluster-robust variance of the pooled mean,
B / (B - 1) * sum_b (n_b / N)^2 (m_b - mean)^2, and of the pooled variance, the same sum over each batch's second moment
about the pooled mean q_b = v_b + (m_b - mean)^2 against var. Both are kept streaming, without the batches: each batch
adds (d_b, a_b) = (m_b - c, v_b + (m_b - c)^2) about a fixed centre c (the first batch's mean), weighted n_b^2, to a
weighted mean and co-moment update (West's, the weighted form of Welford's); with D = mean - c,
sum w (m_b - mean)^2 = C_dd + W (mean_d - D)^2 and sum w (q_b - var)^2 = C_aa - 4 D C_ad + 4 D^2 C_dd + W e^2,
e = mean_a - 2 D mean_d + D^2 - var.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np


@dataclass
class ChannelMoments:
    """Streaming per-channel moments of one layer input."""

    count: int = 0
    mean: np.ndarray | None = None
    m2: np.ndarray | None = None
    batches: int = 0
    _spread: _BatchSpread | None = field(default=None, repr=False, compare=False)

    def merge(self, count: int, mean: np.ndarray, var: np.ndarray) -> None:
        """Merge in `count` values per channel with this mean and population variance."""
        mean = np.asarray(mean, dtype=np.float64)
        m2 = np.asarray(var, dtype=np.float64) * count
        if count <= 0:
            return
        self.batches += 1
        if self._spread is None:
            self._spread = _BatchSpread(mean.copy())
        self._spread.add(count, mean, np.asarray(var, dtype=np.float64))
        if self.count == 0 or self.mean is None:
            self.count, self.mean, self.m2 = count, mean.copy(), m2.copy()
            return
        total = self.count + count
        delta = mean - self.mean
        self.mean = self.mean + delta * (count / total)
        self.m2 = self.m2 + m2 + np.square(delta) * (self.count * count / total)
        self.count = total

    def merge_sums(self, count: int, sums, squares) -> None:
        """Merge in `count` values per channel given their sum and sum of squares (float32 reductions are fine: the
        variance E[x^2] - mean^2 of one batch loses about 1e-7 * (1 + mean^2 / var) of itself, relatively)."""
        if count <= 0:
            return
        mean = np.asarray(sums, dtype=np.float64) / count
        var = np.maximum(np.asarray(squares, dtype=np.float64) / count - np.square(mean), 0.0)
        self.merge(count, mean, var)

    @property
    def var(self) -> np.ndarray:
        return self.m2 / self.count

    def standard_errors(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(se of the mean, se of the variance) per channel, measured on the window's batches;
        None under two batches."""
        if self.batches < 2 or self._spread is None:
            return None
        return self._spread.errors(self.count, self.mean, self.var, self.batches)


class _BatchSpread:
    """The weighted (n_b^2) mean and co-moments of each batch's (d_b, a_b) about a fixed centre
    (see the module docstring)."""

    def __init__(self, centre: np.ndarray):
        self.centre = centre
        self.weight = 0.0
        zeros = np.zeros_like(centre)
        self.mean_d, self.mean_a, self.c_dd, self.c_aa, self.c_ad = (
            zeros,
            zeros.copy(),
            zeros.copy(),
            zeros.copy(),
            zeros.copy(),
        )

    def add(self, count: int, mean: np.ndarray, var: np.ndarray) -> None:
        w = float(count) ** 2
        d = mean - self.centre
        a = var + np.square(d)
        self.weight += w
        delta_d, delta_a = d - self.mean_d, a - self.mean_a
        self.mean_d = self.mean_d + delta_d * (w / self.weight)
        self.mean_a = self.mean_a + delta_a * (w / self.weight)
        self.c_dd = self.c_dd + w * delta_d * (d - self.mean_d)
        self.c_aa = self.c_aa + w * delta_a * (a - self.mean_a)
        self.c_ad = self.c_ad + w * delta_d * (a - self.mean_a)

    def errors(self, count: int, mean: np.ndarray, var: np.ndarray, batches: int) -> tuple[np.ndarray, np.ndarray]:
        shift = mean - self.centre
        about_mean = self.c_dd + self.weight * np.square(self.mean_d - shift)
        e = self.mean_a - 2.0 * shift * self.mean_d + np.square(shift) - var
        about_var = (
            self.c_aa - 4.0 * shift * self.c_ad + 4.0 * np.square(shift) * self.c_dd + self.weight * np.square(e)
        )
        scale = batches / (batches - 1) / float(count) ** 2
        return np.sqrt(np.maximum(about_mean, 0.0) * scale), np.sqrt(np.maximum(about_var, 0.0) * scale)


@dataclass
class Window:
    """The open window: how many requests it saw and sampled, and each tapped layer's moments."""

    layers: int
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    requests: int = 0
    sampled: int = 0
    moments: list[ChannelMoments] = field(default_factory=list)

    def __post_init__(self):
        if not self.moments:
            self.moments = [ChannelMoments() for _ in range(self.layers)]

    def payload(
        self, names: list[str], replica: str, dropped: int, digest: str | None, faults: list[dict] | None = None
    ) -> dict:
        """The JSON body of POST .../drift (schemas.monitoring.DriftWindow), closing the window now."""
        layers = [_layer(name, m) for name, m in zip(names, self.moments) if m.count > 0]
        return {
            "started_at": self.started_at.isoformat(),
            "ended_at": datetime.now(UTC).isoformat(),
            "requests": self.requests,
            "sampled": self.sampled,
            "replica": replica,
            "dropped": dropped,
            "statistics_digest": digest,
            "layers": layers,
            "faults": list(faults or []),
        }


def _layer(name: str, moments: ChannelMoments) -> dict:
    """One layer of the payload: its moments, the batches they pooled and, from two batches on,
    their standard errors."""
    layer = {
        "name": name,
        "count": moments.count,
        "mean": moments.mean.tolist(),
        "var": moments.var.tolist(),
        "batches": moments.batches,
    }
    errors = moments.standard_errors()
    if errors is not None:
        layer["se_mean"], layer["se_var"] = errors[0].tolist(), errors[1].tolist()
    return layer


__all__ = ["ChannelMoments", "Window"]
