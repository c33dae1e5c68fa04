"""One statistics window of the serving collector: per layer, per channel, a streaming count, mean and M2.

Each sampled request's batch moments are merged in with Chan, Golub and LeVeque's pairwise update (the parallel form
of Welford's), which is exact in float64 whatever the order and sizes of the batches:
n = na + nb, d = mb - ma, mean = ma + d * nb / n, M2 = M2a + M2b + d^2 * na * nb / n; the population variance is M2 / n.
The merged window equals LayerMoments.pooled() over the same batches (tests/converters/models check both against NumPy).
A torch tap hands over a batch's per-channel sum and sum of squares instead (two plain reductions, far cheaper on the
request thread than torch.var_mean); `merge_sums` turns them into the batch's mean and variance in float64 first.
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

    def merge(self, count: int, mean: np.ndarray, var: np.ndarray) -> None:
        """Merge in `count` values per channel with this mean and population variance."""
        mean = np.asarray(mean, dtype=np.float64)
        m2 = np.asarray(var, dtype=np.float64) * count
        if count <= 0:
            return
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

    def payload(self, names: list[str], replica: str, dropped: int, digest: str | None) -> dict:
        """The JSON body of POST .../drift (schemas.monitoring.DriftWindow), closing the window now."""
        layers = [{"name": name, "count": m.count, "mean": m.mean.tolist(), "var": m.var.tolist()}
                  for name, m in zip(names, self.moments) if m.count > 0]
        return {"started_at": self.started_at.isoformat(), "ended_at": datetime.now(UTC).isoformat(), "requests": self.requests,
                "sampled": self.sampled, "replica": replica, "dropped": dropped, "statistics_digest": digest, "layers": layers}


__all__ = ["ChannelMoments", "Window"]
