"""What a serving collector sends (one statistics window) and what the registry keeps of it (the drift history).

The collector (`converters.monitor`) posts a `DriftWindow` as JSON to
`POST /api/v1/models/{name}/versions/{n}/drift`; the registry compares every layer's pooled input
statistics with the running statistics stored for that version and keeps a `WindowRecord` per
window, with an overall `DriftState` that a sustained-shift rule (`DriftRule`) moves one window at a
time, except a serving fault (`ServingFault`: the model served in train mode, with statistics changing or not the
version's), which makes the state `serving_fault` from the one window that carries it. Both sides import these models
from here, so neither imports the other.

A window is refused (422, naming the field) unless the registry can store it as sent: its times carry a UTC offset and
lie in the years 1 to 9999 once in UTC, and its counts fit the database's 64-bit integers (MAX_COUNT).

A window is a sample of traffic, so each layer may carry the standard errors of its mean and variance, measured on the
batches it pooled (`batches`, `se_mean`, `se_var`); the rule counts a layer over a threshold only beyond them
(converters/models/monitoring/sampling_error.py). The state is the serving windows' alone: an offline check recorded
with `normbridge drift --record` is shown beside it, never counted in it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

#: serving_fault: the newest window carries a serving fault (ServingFault): the model is served wrongly, whatever
#: its inputs.
State = Literal["ok", "warning", "alert", "serving_fault"]
#: What a serving fault is: a torch module served in train mode (a tapped BatchNorm with training=True), running
#: statistics that changed since the previous window (or since the collector started), a served graph computing batch
#: statistics (a training-mode batch_norm op, an ONNX BatchNormalization with training_mode=1), or served statistics
#: whose digest is not the registered version's (the registry finds this one, on the window's statistics_digest).
FaultKind = Literal["train_mode", "statistics_changed", "batch_statistics_in_graph", "statistics_mismatch"]
#: Why a stored layer reads as it does: its input matches the statistics, its input moved,
#: or the statistics never converged.
LayerStatus = Literal["ok", "drift", "unconverged_statistics"]

#: Channels one layer may send (a bound on the body; ResNet-50's widest BatchNorm has 2048).
MAX_CHANNELS = 65_536
#: Layers one window may carry.
MAX_LAYERS = 4_096
#: Serving faults one window may carry (one per faulty layer; beyond it the collector keeps the first ones).
MAX_FAULTS = 64
#: The largest count a window may carry: what a 64-bit signed integer column (SQLite, PostgreSQL BIGINT) holds.
MAX_COUNT = 2**63 - 1


def statistics_digest(layers: Iterable[tuple[object, object]]) -> str:
    """sha256 of a model's running statistics: one (running_mean, running_var) pair per BatchNorm layer.

    Each pair is taken as float64 (exact for float16/32 values) and the pairs are sorted by their bytes, so the digest
    names no layer and ignores order: a torch module, its ONNX export and the registered version agree on it whatever
    each calls its layers. Two models share it exactly when they hold the same statistics.
    """
    parts = sorted(
        np.asarray(mean, dtype="<f8").tobytes() + b"|" + np.asarray(var, dtype="<f8").tobytes() for mean, var in layers
    )
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LayerWindow(_Frozen):
    """One normalization layer's input over a window: per-channel mean and population variance of `count` values per
    channel."""

    name: str = Field(
        min_length=1,
        max_length=512,
        description="Module path (torch), layer name (Keras) or BatchNormalization name (ONNX).",
    )
    count: int = Field(
        ge=1,
        le=MAX_COUNT,
        description="Values per channel pooled into mean and var (batch x spatial positions, over the sampled requests).",
    )
    mean: list[float] = Field(min_length=1, max_length=MAX_CHANNELS, description="Per-channel mean of the layer input.")
    var: list[float] = Field(
        min_length=1,
        max_length=MAX_CHANNELS,
        description="Per-channel population variance (ddof=0) of the layer input.",
    )
    batches: int | None = Field(
        None,
        ge=1,
        le=MAX_COUNT,
        description="Batches pooled into mean and var, one per observed request (converters.monitor sends it). "
        "A layer of one batch cannot alarm: its sampling error cannot be measured.",
    )
    se_mean: list[float] | None = Field(
        None,
        min_length=1,
        max_length=MAX_CHANNELS,
        description="Per-channel standard error of mean, from the spread of the batches' means "
        "(cluster-robust; with batches >= 2). Absent: computed from count as for independent values.",
    )
    se_var: list[float] | None = Field(
        None,
        min_length=1,
        max_length=MAX_CHANNELS,
        description="Per-channel standard error of var, from the spread of the batches' second moments (with se_mean).",
    )

    @model_validator(mode="after")
    def _same_channels(self):
        if len(self.mean) != len(self.var):
            raise ValueError(
                f"layer '{self.name}': mean has {len(self.mean)} channels and var {len(self.var)}; send one value per channel in each."
            )
        mean, var = np.asarray(self.mean, dtype=np.float64), np.asarray(self.var, dtype=np.float64)
        if not (np.isfinite(mean).all() and np.isfinite(var).all()):
            raise ValueError(
                f"layer '{self.name}': mean and var must be finite numbers (a NaN or infinite input was pooled); "
                "a window of such inputs measures nothing."
            )
        if (var < 0).any():
            raise ValueError(
                f"layer '{self.name}': var holds a negative value ({float(var.min())}); a variance is at least 0."
            )
        self._check_errors()
        return self

    def _check_errors(self) -> None:
        """Standard errors come in pairs, one per channel, finite and non-negative,
        measured on at most `count` batches."""
        if self.batches is not None and self.batches > self.count:
            raise ValueError(
                f"layer '{self.name}': batches={self.batches} exceeds count={self.count}; each batch holds at least one value."
            )
        if (self.se_mean is None) != (self.se_var is None):
            raise ValueError(f"layer '{self.name}': send se_mean and se_var together (or neither).")
        if self.se_mean is None:
            return
        if self.batches is None or self.batches < 2:
            raise ValueError(
                f"layer '{self.name}': se_mean and se_var need batches >= 2 (got {self.batches}); "
                "standard errors are measured on the spread of two batches or more."
            )
        for field in ("se_mean", "se_var"):
            errors = np.asarray(getattr(self, field), dtype=np.float64)
            if len(errors) != len(self.mean):
                raise ValueError(
                    f"layer '{self.name}': {field} has {len(errors)} channels and mean {len(self.mean)}; send one per channel."
                )
            if not np.isfinite(errors).all() or (errors < 0).any():
                raise ValueError(
                    f"layer '{self.name}': {field} must hold finite numbers of at least 0 (a standard error)."
                )


class ServingFault(_Frozen):
    """One way the served model is not serving the registered version as registered (docs/monitoring.md).

    A fault is reported by the first window that sees it and makes the version's state `serving_fault` at once: unlike
    drift, it says nothing about the traffic and needs no sustained-shift rule to be believed."""

    kind: FaultKind
    layer: str | None = Field(
        None,
        max_length=512,
        description="The layer it concerns; None when it concerns the whole model (statistics_mismatch).",
    )
    detail: str | None = Field(None, max_length=512, description="What was seen, in words.")


class DriftWindow(_Frozen):
    """One closed window of sampled serving traffic, as the collector ships it."""

    started_at: datetime = Field(
        description="When the window opened: ISO 8601 with a UTC offset (read and stored in UTC)."
    )
    ended_at: datetime = Field(description="When the window closed: ISO 8601 with a UTC offset.")
    requests: int = Field(ge=0, le=MAX_COUNT, description="Requests the model served in the window.")
    sampled: int = Field(
        ge=1, le=MAX_COUNT, description="Requests whose layer inputs were pooled (sample_rate of `requests`)."
    )
    replica: str | None = Field(default=None, max_length=255, description="Who sent it (host:pid by default).")
    dropped: int = Field(
        default=0,
        ge=0,
        le=MAX_COUNT,
        description="Windows this collector dropped so far (registry unreachable, queue full).",
    )
    statistics_digest: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the running statistics the served model holds (converters.monitoring digest).",
    )
    layers: list[LayerWindow] = Field(min_length=1, max_length=MAX_LAYERS)
    faults: list[ServingFault] = Field(
        default_factory=list,
        max_length=MAX_FAULTS,
        description="Serving faults the collector saw in this window (train mode, statistics changing between windows, "
        "batch statistics computed by the served graph).",
    )

    @field_validator("started_at", "ended_at")
    @classmethod
    def _in_utc(cls, at: datetime, info: ValidationInfo) -> datetime:
        """The time in UTC. One without an offset names no instant (and cannot be compared with one that has it), and
        one that leaves the years 1-9999 in UTC cannot be stored."""
        if at.tzinfo is None or at.utcoffset() is None:
            raise ValueError(
                f"{info.field_name} '{at.isoformat()}' has no UTC offset; send the time with its offset, e.g. "
                f"'{at.replace(tzinfo=UTC).isoformat()}' (converters.monitor sends UTC)."
            )
        try:
            return at.astimezone(UTC)
        except OverflowError:
            raise ValueError(
                f"{info.field_name} '{at.isoformat()}' falls outside the years 1 to 9999 once converted to UTC; "
                "send the window's real time."
            ) from None

    @model_validator(mode="after")
    def _consistent(self):
        if self.ended_at < self.started_at:
            raise ValueError(
                f"the window ends ({self.ended_at.isoformat()}) before it starts ({self.started_at.isoformat()})."
            )
        names = [layer.name for layer in self.layers]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(
                f"layer(s) {', '.join(repeated[:5])} appear more than once; send each layer once per window."
            )
        return self


class DriftRule(_Frozen):
    """The sustained-shift rule: a layer is over a threshold when some channel's statistic exceeds it by more than its
    sampling error allows (`false_alarm`, sampling_error.py); a window is over threshold when any layer's status is
    drift (over, statistics converged); `alert` when at least `k` of the last `m` windows are over, `warning` when at
    least one of them is, `ok` otherwise. A layer whose statistics never converged
    (unconverged_statistics) does not make its window over."""

    shift: float = Field(
        0.5, gt=0, description="Max standardized mean shift |mean - running_mean| / sqrt(running_var + eps) of a layer."
    )
    log_ratio: float = Field(
        0.6931471805599453, gt=0, description="Max |log((var + eps) / (running_var + eps))|; log(2) = a factor of two."
    )
    false_alarm: float = Field(
        0.01,
        gt=0,
        lt=0.5,
        description="Largest share of windows in which a layer whose every channel sits at a "
        "threshold may alarm by sampling error alone: a channel counts only beyond t * its standard error, t "
        "Student's quantile at 1 - false_alarm / (2 * channels).",
    )
    k: int = Field(3, ge=1, description="Windows over threshold among the last m that make an alert.")
    m: int = Field(5, ge=1, le=64, description="How many recent windows the rule looks at.")

    @model_validator(mode="after")
    def _k_within_m(self):
        if self.k > self.m:
            raise ValueError(f"k={self.k} exceeds m={self.m}; an alert needs k of the last m windows, so k <= m.")
        return self

    def state_of(self, recent: str) -> State:
        """The state for `recent`, the over-threshold flags ('1'/'0') of the last windows, oldest first (at most m)."""
        over = recent[-self.m :].count("1")
        return "alert" if over >= self.k else "warning" if over else "ok"


class LayerShift(_Frozen):
    """One layer of one stored window against the version's running statistics."""

    name: str
    channels: int
    count: int
    max_shift: float = Field(description="Largest standardized mean shift over channels.")
    mean_shift: float
    worst_shift_channel: int
    variance_ratio: float = Field(
        description="(var + eps) / (running_var + eps) of the channel furthest from 1 (log scale)."
    )
    max_abs_log_ratio: float
    batches: int | None = Field(
        None,
        description="Batches the window pooled for this layer; None: the window did not say (standard "
        "errors from count), or the layer was stored before migration 0010.",
    )
    shift_bound: float | None = Field(
        None,
        description="Max over channels of shift - error_multiplier * its standard error: the shift "
        "the window shows beyond its sampling error. None: one batch (cannot alarm) or stored before 0010.",
    )
    log_ratio_bound: float | None = Field(
        None, description="Max over channels of |log ratio| - error_multiplier * its standard error."
    )
    error_multiplier: float | None = Field(
        None, description="How many standard errors a channel had to clear a threshold by (rule.false_alarm)."
    )
    over: bool = Field(
        description="shift_bound or log_ratio_bound over its threshold, by the rule in force when the window was stored "
        "(before migration 0010: max_shift or max_abs_log_ratio over it)."
    )
    status: LayerStatus = Field(
        "ok",
        description="drift when over and the version's statistics converged; unconverged_statistics when "
        "they never did (converters/models/monitoring/convergence.py), over or not; ok otherwise. Only "
        "drift counts toward the sustained-shift rule.",
    )
    initial_weight: float | None = Field(
        None,
        description="Share of BatchNorm's initial values (mean 0, variance 1) judged left in the "
        "version's running statistics, where known or fitted.",
    )


class WindowRecord(_Frozen):
    """One stored window: when, who, how much traffic, each layer's shift, and the version's state right after it."""

    id: int
    received_at: datetime
    started_at: datetime
    ended_at: datetime
    replica: str | None
    user: str
    requests: int
    sampled: int
    dropped: int
    statistics_digest: str | None
    over: bool = Field(
        description="Some layer's status is drift: the window counts toward the rule (unconverged layers never do)."
    )
    state: State
    layers: list[LayerShift]
    unmatched: list[str] = Field(
        default_factory=list, description="Layers sent that the version holds no running statistics for."
    )
    faults: list[ServingFault] = Field(
        default_factory=list,
        description="The window's serving faults: those the collector sent and statistics_mismatch "
        "when its statistics_digest is not the version's (before migration 0012: none).",
    )


class OfflineCheck(_Frozen):
    """The newest offline check recorded against a version (`normbridge drift MODEL DATA --record NAME@N`), shown beside
    the serving state and never counted in it: the data of an offline check is whatever file was given (a test set, a
    what-if shift, the traffic of an alert under investigation), not the traffic the version serves."""

    report: int = Field(description="The recorded report's id (its full report is in `reports`).")
    checked_at: datetime
    user: str
    verdict: Literal["no drift", "drift", "unconverged statistics"]
    samples: int = Field(description="Inputs the check measured.")
    alarms: list[str] = Field(description="Layers it found drifted.")
    unconverged: list[str] = Field(
        default_factory=list, description="Layers whose statistics it found never converged."
    )
    checks: int = Field(description="Offline checks recorded against the version in all.")


class DriftHistory(_Frozen):
    """A version's drift history, newest window first, and its current state (serving windows only), with the newest
    offline check beside it."""

    model: str
    number: int
    state: State = Field(
        description="The serving state, moved by serving windows only (the sustained-shift rule; 'ok' "
        "before the first; serving_fault while the newest window carries a serving fault). "
        "Offline checks recorded with `normbridge drift --record` never move it: the newest is `offline`."
    )
    faults: list[ServingFault] = Field(
        default_factory=list, description="The serving faults of the newest window (state serving_fault)."
    )
    rule: DriftRule
    windows_total: int = Field(
        description="Windows stored for the version since its first (the history below may be limited)."
    )
    recent: str = Field(description="Over-threshold flags of the last m windows, oldest first ('1' = over).")
    offline: OfflineCheck | None = Field(
        None,
        description="The newest offline check (`drift --record`), beside the state and never "
        "counted in it; None when none was recorded.",
    )
    windows: list[WindowRecord]


__all__ = [
    "statistics_digest",
    "DriftHistory",
    "DriftRule",
    "DriftWindow",
    "FaultKind",
    "LayerShift",
    "LayerStatus",
    "LayerWindow",
    "MAX_CHANNELS",
    "MAX_COUNT",
    "MAX_FAULTS",
    "MAX_LAYERS",
    "OfflineCheck",
    "ServingFault",
    "State",
    "WindowRecord",
]
