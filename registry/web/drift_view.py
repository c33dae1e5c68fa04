"""What the pages show of drift: a version's state from its newest recorded check, and each layer's shift over time.

A state reads 'alert' when the newest recorded check found drift, 'unconverged' when it found only
statistics that never converged, 'ok' otherwise; a version with no recorded check has none.
"""

from __future__ import annotations

from registry.drift_records import latest_drift_reports

from .timeline_svg import Window, timeline_svg

#: The newest check's verdict -> the state a page shows.
STATES = {"drift": "alert", "unconverged statistics": "unconverged", "no drift": "ok"}


def report_state(report) -> str:
    return STATES.get(report.verdict, "ok")


def drift_states(registry) -> dict[tuple[str, int], str]:
    """(model, number) -> state, for every version with a recorded check (one query)."""
    return {(record.model, record.number): report_state(record.report) for record in latest_drift_reports(registry.meta)}


def shift_timeline(records) -> str:
    """Each layer's max standardized shift in every recorded check (records newest first, drawn oldest first) against the threshold."""
    ordered = list(reversed(records))
    if not ordered:
        return ""
    layers = [layer.name for layer in ordered[-1].report.layers]
    layers += [name for record in ordered for name in (layer.name for layer in record.report.layers) if name not in layers]
    windows = [Window(label=record.created_at.strftime("%m-%d %H:%M:%S"), alert=record.report.verdict == "drift",
                      values={layer.name: layer.max_shift for layer in record.report.layers}) for record in ordered]
    threshold = ordered[-1].report.thresholds.shift
    return timeline_svg(windows, list(dict.fromkeys(layers)), threshold,
                        f"max standardized mean shift per layer over {len(windows)} recorded check(s); shaded: drift")


__all__ = ["STATES", "drift_states", "report_state", "shift_timeline"]
