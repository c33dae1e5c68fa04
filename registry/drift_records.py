"""Drift checks recorded against a registered version, so the web pages can chart the last one.

`normbridge drift --record NAME@N` (or any caller of `record_drift`) stores the whole
`schemas.serving.DriftReport` as JSON in the drift_reports table (migration 0002), keyed by the
version's row id: the report keeps its thresholds, so a chart drawn later compares each layer
against the threshold the check actually used, not today's default.

A recorded check never moves the version's drift state, which only serving windows move (drift_history.py): its data is
whatever file was given, not the traffic the version serves. The newest one is shown beside the state (`offline_check`).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.db.models import DriftReportRow, ModelRow, VersionRow, utc
from registry.db.engine import READ_ONLY
from registry.db import queries
from registry.drift_reference import reference_of
from schemas.errors import InvalidReferenceError, RegistryError
from schemas.monitoring import OfflineCheck
from schemas.serving import DriftReport


class DriftRecord(BaseModel):
    """One stored drift check of a version (the JSON the API's drift endpoint returns per report)."""

    model_config = ConfigDict(frozen=True)

    id: int
    model: str
    number: int
    created_at: datetime
    user: str
    report: DriftReport


def _as_report(report) -> DriftReport:
    if isinstance(report, DriftReport):
        return report
    if isinstance(report, dict):
        return DriftReport.model_validate(report)
    raise RegistryError(
        f"got a {type(report).__name__} as drift report; pass the DriftReport that drift_check returned (or its JSON dict)."
    )


def check_consistent(report: DriftReport, reference) -> None:
    """Refuse (InvalidReferenceError, HTTP 422, naming the first layer and setting at fault) a report that does not say
    what its own numbers say: an alarm not given by its thresholds, alarms, unconverged layers or a verdict other than
    its layers', a number that is not finite, or a layer the version does not have. The server cannot re-measure an
    offline report; it can refuse one that contradicts itself."""
    t, problems = report.thresholds, []  # (layer or None, setting, what is wrong)
    for layer in report.layers:
        numbers = (layer.max_shift, layer.mean_shift, layer.max_abs_log_ratio, layer.mean_abs_log_ratio)
        if not all(math.isfinite(x) for x in numbers):
            problems.append((layer.name, "max_shift", f"layer '{layer.name}' holds a number that is not finite"))
        elif layer.alarm != (layer.max_shift > t.shift or layer.max_abs_log_ratio > t.log_ratio):
            problems.append(
                (
                    layer.name,
                    "alarm",
                    f"layer '{layer.name}' says alarm={layer.alarm} at max shift {layer.max_shift:g} and max "
                    f"|log ratio| {layer.max_abs_log_ratio:g} against thresholds {t.shift:g} and {t.log_ratio:g}",
                )
            )
        if (layer.status == "drift") != layer.alarm and layer.status != "unconverged_statistics":
            problems.append(
                (
                    layer.name,
                    "status",
                    f"layer '{layer.name}' has status {layer.status} with alarm={layer.alarm} "
                    "(an alarm is drift or unconverged statistics)",
                )
            )
        if reference.layer(layer.name) is None:
            problems.append((layer.name, "name", f"layer '{layer.name}' is not a BatchNorm of {reference.ref}"))
    alarms = [layer.name for layer in report.layers if layer.status == "drift"]
    unconverged = [layer.name for layer in report.layers if layer.status == "unconverged_statistics"]
    verdict = "drift" if alarms else "unconverged statistics" if unconverged else "no drift"
    if list(report.alarms) != alarms or list(report.unconverged) != unconverged or report.verdict != verdict:
        problems.append(
            (
                None,
                "verdict",
                f"its alarms, unconverged layers and verdict ({report.verdict!r}) are not its layers' ({verdict!r})",
            )
        )
    if problems:
        layer, setting, _ = problems[0]
        raise InvalidReferenceError(
            f"the drift report is not consistent: {'; '.join(text for _, _, text in problems[:5])}; record the "
            "report `normbridge drift MODEL DATA --record NAME@N` wrote, unchanged.",
            layer=layer,
            setting=setting,
        )


def check_belongs(registry, version, report: DriftReport) -> None:
    """Refuse a report computed on a model whose running statistics are not `version`'s (their digests differ), or one
    that contradicts itself (check_consistent)."""
    reference = reference_of(registry, version)
    expected = reference.digest
    if report.statistics_digest is None:
        raise RegistryError(
            f"the drift report carries no statistics_digest, so it cannot be shown to belong to {version.model}@{version.number}; "
            "compute it again with this normbridge (`normbridge drift MODEL DATA --record NAME@N`)."
        )
    if report.statistics_digest != expected:
        raise RegistryError(
            f"the drift report was computed on a model whose running statistics (digest {report.statistics_digest[:12]}) are not "
            f"those of {version.model}@{version.number} (digest {expected[:12]}); run drift on the model registered as that "
            "version, or record the report against the version it was computed on."
        )
    check_consistent(report, reference)


def record_drift(registry, ref: str, report) -> DriftRecord:
    """Store `report` (a DriftReport or its JSON dict) against version `ref` ('name@N', 'name@alias' or 'name').

    Refused (RegistryError) when the report's statistics_digest is not the version's: a report belongs to its version.
    """
    report = _as_report(report)
    version = registry.show(ref)
    check_belongs(registry, version, report)
    at = datetime.now(UTC).replace(tzinfo=None)
    with Session(registry.meta.engine) as session, session.begin():
        row = DriftReportRow(
            version_id=queries.version_id(session, version.model, version.number),
            created_at=at,
            user=registry.user,
            report=report.model_dump(mode="json"),
        )
        session.add(row)
        session.flush()
        detail = {
            "drift_report": row.id,
            "verdict": report.verdict,
            "alarms": list(report.alarms),
            "samples": report.samples,
        }
        # Same transaction: a stored report always has its audit entry, and a failed append stores nothing.
        registry.meta.append_audit(
            "drift_recorded", version.model, version.number, detail, registry.user, session=session
        )
        return DriftRecord(
            id=row.id, model=version.model, number=version.number, created_at=utc(at), user=registry.user, report=report
        )


def drift_reports(registry, ref: str) -> list[DriftRecord]:
    """Every drift check recorded for version `ref`, newest first (empty when none was recorded)."""
    version = registry.show(ref)
    with Session(registry.meta.engine.execution_options(**{READ_ONLY: True})) as session:
        version_id = queries.version_id(session, version.model, version.number)
        rows = session.scalars(
            select(DriftReportRow).where(DriftReportRow.version_id == version_id).order_by(DriftReportRow.id.desc())
        ).all()
        return [
            DriftRecord(
                id=row.id,
                model=version.model,
                number=version.number,
                created_at=utc(row.created_at),
                user=row.user,
                report=DriftReport.model_validate(row.report),
            )
            for row in rows
        ]


def offline_check(registry, version) -> OfflineCheck | None:
    """The newest check recorded against `version` (a VersionRecord) and how many there are, in two queries;
    None when none was."""
    with Session(registry.meta.engine.execution_options(**{READ_ONLY: True})) as session:
        version_id = queries.version_id(session, version.model, version.number)
        checks = session.scalar(
            select(func.count()).select_from(DriftReportRow).where(DriftReportRow.version_id == version_id)
        )
        if not checks:
            return None
        row = session.scalars(
            select(DriftReportRow)
            .where(DriftReportRow.version_id == version_id)
            .order_by(DriftReportRow.id.desc())
            .limit(1)
        ).one()
        report = DriftReport.model_validate(row.report)
        return OfflineCheck(
            report=row.id,
            checked_at=utc(row.created_at),
            user=row.user,
            verdict=report.verdict,
            samples=report.samples,
            alarms=report.alarms,
            unconverged=report.unconverged,
            checks=checks,
        )


def latest_drift_reports(meta) -> list[DriftRecord]:
    """The newest recorded drift report of every version that has one (one query; what GET /metrics exports)."""
    newest = (
        select(DriftReportRow.version_id, func.max(DriftReportRow.id).label("id"))
        .group_by(DriftReportRow.version_id)
        .subquery()
    )
    query = (
        select(DriftReportRow, ModelRow.name, VersionRow.number)
        .join(newest, DriftReportRow.id == newest.c.id)
        .join(VersionRow, DriftReportRow.version_id == VersionRow.id)
        .join(ModelRow, VersionRow.model_id == ModelRow.id)
    )
    with Session(meta.engine.execution_options(**{READ_ONLY: True})) as session:
        return [
            DriftRecord(
                id=row.id,
                model=name,
                number=number,
                created_at=utc(row.created_at),
                user=row.user,
                report=DriftReport.model_validate(row.report),
            )
            for row, name, number in session.execute(query)
        ]


__all__ = ["DriftRecord", "check_belongs", "drift_reports", "latest_drift_reports", "offline_check", "record_drift"]
