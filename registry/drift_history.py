"""The drift history of a version: statistics windows shipped by serving collectors, compared with the version's own
running statistics, and an alert state moved one window at a time by a sustained-shift rule.

The store API (the HTTP routes, the metrics endpoint and the pages call only these):

- `record_window(registry, ref, window)`: store one `schemas.monitoring.DriftWindow` against version `ref`, returning
  its `WindowRecord`. A bounded number of statements per window whatever its size: lock the version row, look the window
  up by its content digest, read the state row, insert the window, insert every layer summary in one executemany, insert
  the compressed per-channel arrays, write the state row (and an audit entry only when the state changes). The history
  is never rescanned. `store_window` does the same and also says whether the window was new.
- A window's identity is its version and `window_digest`, the sha256 of its canonical content: every field as validated
  (times in UTC), serialised by the schema in its field order. A window posted again (the collector's retry, a replay)
  is not stored or counted a second time: the stored window comes back instead.
- `history(registry, ref, limit=100)`: the `DriftHistory` (state, rule, newest windows first with their layers, and the
  newest offline check beside the state).
- `state(registry, ref)`: the version's state alone ('ok' when nothing was recorded).
- `states(registry)`: every version's state that has windows, in one query (the pages' drift column).
- `current(registry)`: one `VersionDrift` per version that has windows: its state and its newest window's layers (the
  metrics endpoint reads this, in two queries).

The rule (`DriftRule`): a layer is over threshold when some channel's standardized mean shift exceeds `shift` (0.5) or
its |log variance ratio| exceeds `log_ratio` (log 2) by more than its sampling error allows: t standard errors, measured
on the window's batches, t chosen so that a layer sitting at a threshold alarms in at most `false_alarm` (1%) of windows
(converters/models/monitoring/sampling_error.py; a layer seen in one batch cannot alarm); each layer then gets the
status the `drift` command gives it (drift_status.py): `unconverged_statistics` when the version's stored statistics
never converged, `drift` when over with converged statistics, `ok` otherwise. A window is over when any layer's status
is drift (unconverged layers never count); the state is `alert` when at least `k` (3) of the last `m` (5) windows are
over, `warning` when at least one is, `ok` otherwise. Override with $NORMBRIDGE_DRIFT_SHIFT,
$NORMBRIDGE_DRIFT_LOG_RATIO, $NORMBRIDGE_DRIFT_FALSE_ALARM, $NORMBRIDGE_DRIFT_K, $NORMBRIDGE_DRIFT_M. A serving fault
(schemas.monitoring.ServingFault: a module served in train mode, running statistics changing between windows, a served
graph computing batch statistics, sent by the collector; statistics_mismatch, added here when the window's
statistics_digest is not the version's) makes the state `serving_fault` at once, with no k of m: it says the model is
served wrongly, not that its traffic moved. The window is stored with its faults (a mismatched digest is no longer
refused), and the next window without a fault puts the state back where the rule has it. Only serving windows move the
state: offline checks (`drift --record`, drift_records.py) are shown beside it. Per-channel arrays are kept
$NORMBRIDGE_DRIFT_RETENTION_DAYS days (30; 0 keeps them forever); the summaries are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from converters.models.monitoring.drift import channel_shift
from converters.models.monitoring.sampling_error import judge_layer
from registry.db.drift_rows import DriftArraysRow, DriftLayerRow, DriftStateRow, DriftWindowRow
from registry.db.engine import READ_ONLY
from registry.db import queries
from registry.db.models import ModelRow, VersionRow, utc
from registry.drift_records import offline_check
from registry.drift_reference import Reference, reference_of
from registry.drift_status import downstream_of_unconverged, layer_status
from schemas.errors import InputFileError
from schemas.monitoring import (
    MAX_FAULTS,
    DriftHistory,
    DriftRule,
    DriftWindow,
    LayerShift,
    ServingFault,
    State,
    WindowRecord,
)

RULE_ENV = {
    "shift": "NORMBRIDGE_DRIFT_SHIFT",
    "log_ratio": "NORMBRIDGE_DRIFT_LOG_RATIO",
    "false_alarm": "NORMBRIDGE_DRIFT_FALSE_ALARM",
    "k": "NORMBRIDGE_DRIFT_K",
    "m": "NORMBRIDGE_DRIFT_M",
}
RETENTION_ENV = "NORMBRIDGE_DRIFT_RETENTION_DAYS"
DEFAULT_RETENTION_DAYS = 30.0
#: Seconds between two retention sweeps of one process (each is one DELETE statement).
SWEEP_EVERY = 60.0

_sweep_lock = threading.Lock()
_last_sweep = [0.0]


def rule() -> DriftRule:
    """The rule in force: the defaults, overridden by $NORMBRIDGE_DRIFT_* (an unreadable value is an error naming
    it)."""
    values = {}
    for field, env in RULE_ENV.items():
        raw = os.environ.get(env)
        if raw:
            try:
                values[field] = int(raw) if field in ("k", "m") else float(raw)
            except ValueError as error:
                raise InputFileError(
                    f"setting ${env}={raw!r} is not a number; unset it or give e.g. {DriftRule().model_dump()[field]}."
                ) from error
    try:
        return DriftRule(**values)
    except ValueError as error:
        raise InputFileError(f"the drift rule settings $NORMBRIDGE_DRIFT_* are inconsistent: {error}") from error


def retention_days() -> float:
    raw = os.environ.get(RETENTION_ENV)
    try:
        return float(raw) if raw else DEFAULT_RETENTION_DAYS
    except ValueError as error:
        raise InputFileError(
            f"setting ${RETENTION_ENV}={raw!r} is not a number of days; unset it or give e.g. 30."
        ) from error


@dataclass(frozen=True)
class VersionDrift:
    """A version's state and its newest window (what the metrics endpoint exports per version)."""

    model: str
    number: int
    state: State
    windows: int
    recent: str
    last: WindowRecord | None


def _naive(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(tzinfo=None) if at.tzinfo is not None else at


def _shifts(window: DriftWindow, reference: Reference, active: DriftRule) -> tuple[list[LayerShift], list[str], dict]:
    """Each sent layer against the version's running statistics; the layers the version has none for;
    the arrays kept."""
    shifts, unmatched, arrays = [], [], {}
    for layer in window.layers:
        ref = reference.layer(layer.name)
        if ref is None:
            unmatched.append(layer.name)
            continue
        if len(layer.mean) != ref.channels:
            raise InputFileError(
                f"layer '{layer.name}': the window has {len(layer.mean)} channels and version's running statistics {ref.channels}; "
                "the collector watches another model than this version."
            )
        shift, log_ratio = channel_shift(layer.mean, layer.var, ref.running_mean, ref.running_var, ref.eps)
        worst = int(np.abs(log_ratio).argmax())
        judged = judge_layer(
            shift,
            log_ratio,
            layer.var,
            ref.running_var,
            ref.eps,
            layer.count,
            layer.batches,
            layer.se_mean,
            layer.se_var,
            active.shift,
            active.log_ratio,
            active.false_alarm,
        )
        verdict = layer_status(layer.mean, layer.var, ref, active, judged.over)
        shifts.append(
            LayerShift(
                name=layer.name,
                channels=ref.channels,
                count=layer.count,
                max_shift=float(shift.max()),
                mean_shift=float(shift.mean()),
                worst_shift_channel=int(shift.argmax()),
                variance_ratio=float(np.exp(log_ratio[worst])),
                max_abs_log_ratio=float(abs(log_ratio[worst])),
                batches=layer.batches,
                shift_bound=judged.shift_bound,
                log_ratio_bound=judged.log_ratio_bound,
                error_multiplier=judged.multiplier,
                over=judged.over,
                status=verdict.status,
                initial_weight=verdict.initial_weight,
            )
        )
        arrays[layer.name] = layer.model_dump(
            include={"count", "mean", "var", "batches", "se_mean", "se_var"}, exclude_none=True
        )
    if not shifts:
        raise InputFileError(
            f"none of the window's layers ({', '.join(unmatched[:5])}) has running statistics in version "
            f"{reference.ref}; its BatchNorm layers are {', '.join(reference.names()[:5]) or 'none'}."
        )
    return downstream_of_unconverged(shifts), unmatched, arrays


def _layer_rows(window_id: int, shifts: list[LayerShift]) -> list[dict]:
    return [
        {
            "window_id": window_id,
            "layer": s.name,
            "channels": s.channels,
            "count": s.count,
            "max_shift": s.max_shift,
            "mean_shift": s.mean_shift,
            "worst_shift_channel": s.worst_shift_channel,
            "variance_ratio": s.variance_ratio,
            "max_abs_log_ratio": s.max_abs_log_ratio,
            "batches": s.batches,
            "shift_bound": s.shift_bound,
            "log_ratio_bound": s.log_ratio_bound,
            "error_multiplier": s.error_multiplier,
            "over": s.over,
            "status": s.status,
            "initial_weight": s.initial_weight,
        }
        for s in shifts
    ]


def window_digest(window: DriftWindow) -> str:
    """sha256 of the window's canonical content: the same window, however its JSON was spelled, has the same digest."""
    return hashlib.sha256(window.model_dump_json().encode()).hexdigest()


def _faults_of(window: DriftWindow, reference: Reference, version) -> list[ServingFault]:
    """The window's serving faults, with statistics_mismatch first when its statistics are not the version's."""
    found = list(window.faults)
    if window.statistics_digest is not None and window.statistics_digest != reference.digest:
        found.insert(
            0,
            ServingFault(
                kind="statistics_mismatch",
                detail=(
                    f"the served model holds other running statistics (digest {window.statistics_digest[:12]}) than version "
                    f"{version.model}@{version.number} (digest {reference.digest[:12]}): serve the model registered as that "
                    "version, or monitor the version whose statistics it holds"
                ),
            ),
        )
    return found[:MAX_FAULTS]


def _dump_faults(faults: list[ServingFault]) -> str | None:
    return json.dumps([fault.model_dump(exclude_none=True) for fault in faults]) if faults else None


def _load_faults(text: str | None) -> list[ServingFault]:
    return [ServingFault.model_validate(fault) for fault in json.loads(text)] if text else []


def record_window(registry, ref: str, window: DriftWindow | dict, active: DriftRule | None = None) -> WindowRecord:
    """Store one collector window against version `ref`; the version's state moves by the rule (see the module
    docstring), or becomes serving_fault at once when the window carries a serving fault (its statistics_digest not the
    version's is one: statistics_mismatch)."""
    return store_window(registry, ref, window, active)[0]


def store_window(
    registry, ref: str, window: DriftWindow | dict, active: DriftRule | None = None
) -> tuple[WindowRecord, bool]:
    """`record_window`, and whether the window was new (False: the same window was stored before, and comes back as
    stored)."""
    window = window if isinstance(window, DriftWindow) else DriftWindow.model_validate(window)
    digest = window_digest(window)
    active = active or rule()
    version = registry.show(ref)
    reference = reference_of(registry, version)
    faults = _faults_of(window, reference, version)
    shifts, unmatched, arrays = _shifts(window, reference, active)
    over = any(s.status == "drift" for s in shifts)  # unconverged statistics never count toward the rule
    at = datetime.now(UTC).replace(tzinfo=None)
    with Session(registry.meta.engine) as session, session.begin():
        version_id = queries.version_id(
            session, version.model, version.number, lock=True
        )  # one writer per version at a time
        stored = session.scalars(
            select(DriftWindowRow).where(
                DriftWindowRow.version_id == version_id, DriftWindowRow.content_digest == digest
            )
        ).one_or_none()
        if stored is not None:  # under the version's lock: two posts of one window cannot both find it absent
            return _records(session, [stored])[0], False
        current = session.get(DriftStateRow, version_id)
        before = current.state if current is not None else "ok"
        recent = ((current.recent if current is not None else "") + ("1" if over else "0"))[-active.m :]
        after = "serving_fault" if faults else active.state_of(recent)
        row = DriftWindowRow(
            version_id=version_id,
            received_at=at,
            started_at=_naive(window.started_at),
            ended_at=_naive(window.ended_at),
            replica=window.replica,
            user=registry.user,
            requests=window.requests,
            sampled=window.sampled,
            dropped=window.dropped,
            statistics_digest=window.statistics_digest,
            over=over,
            state=after,
            unmatched="\n".join(unmatched)[:4096] or None,
            content_digest=digest,
            faults=_dump_faults(faults),
        )
        session.add(row)
        session.flush()
        session.execute(insert(DriftLayerRow), _layer_rows(row.id, shifts))
        session.add(DriftArraysRow(window_id=row.id, data=zlib.compress(json.dumps(arrays).encode(), 6)))
        if current is None:
            session.add(
                DriftStateRow(
                    version_id=version_id, state=after, recent=recent, windows=1, last_window_id=row.id, updated_at=at
                )
            )
        else:
            current.state, current.recent, current.windows = after, recent, current.windows + 1
            current.last_window_id, current.updated_at = row.id, at
        if after != before:
            detail = {"from": before, "to": after, "window": row.id, "recent": recent}
            if faults:
                detail["faults"] = sorted({fault.kind for fault in faults})
            registry.meta.append_audit(
                "drift_state_changed", version.model, version.number, detail, registry.user, session=session
            )
        _sweep(session, at)
        window_id = row.id
    return WindowRecord(
        id=window_id,
        received_at=utc(at),
        started_at=window.started_at,
        ended_at=window.ended_at,
        replica=window.replica,
        user=registry.user,
        requests=window.requests,
        sampled=window.sampled,
        dropped=window.dropped,
        statistics_digest=window.statistics_digest,
        over=over,
        state=after,
        layers=shifts,
        unmatched=unmatched,
        faults=faults,
    ), True


def _sweep(session: Session, now: datetime) -> None:
    """Drop the per-channel arrays older than the retention period, at most once a minute per process
    (one statement)."""
    days = retention_days()
    if days <= 0:
        return
    with _sweep_lock:
        if time.monotonic() - _last_sweep[0] < SWEEP_EVERY:
            return
        _last_sweep[0] = time.monotonic()
    old = select(DriftWindowRow.id).where(DriftWindowRow.received_at < now - timedelta(days=days))
    session.execute(delete(DriftArraysRow).where(DriftArraysRow.window_id.in_(old)))


def _records(session: Session, rows: list[DriftWindowRow]) -> list[WindowRecord]:
    """The windows with their layers (one query for all the layers)."""
    by_window: dict[int, list[LayerShift]] = {row.id: [] for row in rows}
    if rows:
        for layer in session.scalars(
            select(DriftLayerRow).where(DriftLayerRow.window_id.in_(list(by_window))).order_by(DriftLayerRow.id)
        ):
            by_window[layer.window_id].append(
                LayerShift(
                    name=layer.layer,
                    channels=layer.channels,
                    count=layer.count,
                    max_shift=layer.max_shift,
                    mean_shift=layer.mean_shift,
                    worst_shift_channel=layer.worst_shift_channel,
                    variance_ratio=layer.variance_ratio,
                    max_abs_log_ratio=layer.max_abs_log_ratio,
                    batches=layer.batches,
                    shift_bound=layer.shift_bound,
                    log_ratio_bound=layer.log_ratio_bound,
                    error_multiplier=layer.error_multiplier,
                    over=layer.over,
                    status=layer.status,
                    initial_weight=layer.initial_weight,
                )
            )
    return [
        WindowRecord(
            id=row.id,
            received_at=utc(row.received_at),
            started_at=utc(row.started_at),
            ended_at=utc(row.ended_at),
            replica=row.replica,
            user=row.user,
            requests=row.requests,
            sampled=row.sampled,
            dropped=row.dropped,
            statistics_digest=row.statistics_digest,
            over=row.over,
            state=row.state,
            layers=by_window[row.id],
            unmatched=row.unmatched.split("\n") if row.unmatched else [],
            faults=_load_faults(row.faults),
        )
        for row in rows
    ]


def _read(registry) -> Session:
    return Session(registry.meta.engine.execution_options(**{READ_ONLY: True}))


def history(registry, ref: str, limit: int = 100) -> DriftHistory:
    """Version `ref`'s state and its newest `limit` windows, newest first, with its newest offline check beside them."""
    version = registry.show(ref)
    with _read(registry) as session:
        version_id = queries.version_id(session, version.model, version.number)
        current = session.get(DriftStateRow, version_id)
        rows = session.scalars(
            select(DriftWindowRow)
            .where(DriftWindowRow.version_id == version_id)
            .order_by(DriftWindowRow.id.desc())
            .limit(max(0, limit))
        ).all()
        windows = _records(session, list(rows))
        faults = []
        if current is not None and current.state == "serving_fault" and current.last_window_id is not None:
            last = session.get(DriftWindowRow, current.last_window_id)
            faults = _load_faults(last.faults) if last is not None else []
    return DriftHistory(
        model=version.model,
        number=version.number,
        state=current.state if current else "ok",
        rule=rule(),
        faults=faults,
        windows_total=current.windows if current else 0,
        recent=current.recent if current else "",
        offline=offline_check(registry, version),
        windows=windows,
    )


def state(registry, ref: str) -> State:
    """Version `ref`'s state: 'ok' when no window was recorded."""
    version = registry.show(ref)
    with _read(registry) as session:
        current = session.get(DriftStateRow, queries.version_id(session, version.model, version.number))
        return current.state if current else "ok"


def states(registry) -> dict[tuple[str, int], State]:
    """(model, number) -> state for every version with windows, in one query (the pages' state column)."""
    with _read(registry) as session:
        rows = session.execute(
            select(ModelRow.name, VersionRow.number, DriftStateRow.state)
            .join(VersionRow, DriftStateRow.version_id == VersionRow.id)
            .join(ModelRow, VersionRow.model_id == ModelRow.id)
        ).all()
    return {(name, number): found for name, number, found in rows}


def current(registry) -> list[VersionDrift]:
    """Every version with windows: its state and newest window, in two queries (the metrics endpoint's read)."""
    with _read(registry) as session:
        states = session.execute(
            select(DriftStateRow, ModelRow.name, VersionRow.number)
            .join(VersionRow, DriftStateRow.version_id == VersionRow.id)
            .join(ModelRow, VersionRow.model_id == ModelRow.id)
            .order_by(ModelRow.name, VersionRow.number)
        ).all()
        last_ids = [s.last_window_id for s, _, _ in states if s.last_window_id is not None]
        rows = session.scalars(select(DriftWindowRow).where(DriftWindowRow.id.in_(last_ids))).all() if last_ids else []
        last = {record.id: record for record in _records(session, list(rows))}
        return [
            VersionDrift(
                model=name,
                number=number,
                state=s.state,
                windows=s.windows,
                recent=s.recent,
                last=last.get(s.last_window_id),
            )
            for s, name, number in states
        ]


def window_arrays(registry, window_id: int) -> dict | None:
    """The per-channel arrays a window carried ({layer: {count, mean, var}}),
    or None once the retention period dropped them."""
    with _read(registry) as session:
        row = session.get(DriftArraysRow, window_id)
        return None if row is None else json.loads(zlib.decompress(row.data))


__all__ = [
    "DriftHistory",
    "DriftRule",
    "VersionDrift",
    "current",
    "history",
    "record_window",
    "rule",
    "state",
    "states",
    "store_window",
    "window_arrays",
    "window_digest",
]
