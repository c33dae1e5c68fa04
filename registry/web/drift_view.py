"""What the pages show of drift: a version's state, and each layer's shift over time.

A version with serving windows in the drift history shows the history's state (ok, warning or alert, moved by the
sustained-shift rule) and its timeline plots those windows. A version with none falls back on its recorded offline
checks: 'alert' when the newest found drift, 'unconverged' when it found only statistics that never converged, 'ok'
otherwise, and the timeline plots the checks. A version with neither has no state.
"""

from __future__ import annotations

from registry.drift_history import states as history_states
from registry.drift_records import latest_drift_reports

from .timeline_svg import Window, timeline_svg

#: The newest check's verdict -> the state a page shows.
STATES = {"drift": "alert", "unconverged statistics": "unconverged", "no drift": "ok"}


def report_state(report) -> str:
    return STATES.get(report.verdict, "ok")


def drift_states(registry) -> dict[tuple[str, int], str]:
    """(model, number) -> state: the history's where the version has windows, else its newest recorded check's (two queries)."""
    found = {(record.model, record.number): report_state(record.report) for record in latest_drift_reports(registry.meta)}
    found.update(history_states(registry))
    return found


def _layer_order(newest_first: list[list[str]]) -> list[str]:
    """The newest entry's layers first, then any only older entries had."""
    return list(dict.fromkeys(name for names in newest_first for name in names))


def shift_timeline(records) -> str:
    """Each layer's max standardized shift in every recorded check (records newest first, drawn oldest first) against the threshold."""
    ordered = list(reversed(records))
    if not ordered:
        return ""
    layers = _layer_order([[layer.name for layer in record.report.layers] for record in records])
    windows = [Window(label=record.created_at.strftime("%m-%d %H:%M:%S"), alert=record.report.verdict == "drift",
                      values={layer.name: layer.max_shift for layer in record.report.layers},
                      statuses={layer.name: layer.status for layer in record.report.layers}) for record in ordered]
    threshold = ordered[-1].report.thresholds.shift
    return timeline_svg(windows, layers, threshold, f"max standardized mean shift per layer over {len(windows)} recorded check(s); shaded: drift")


def window_timeline(history) -> str:
    """Each layer's max standardized shift in every serving window of a DriftHistory (newest first, drawn oldest first)
    against the rule's shift threshold; a window after which the version was in alert is shaded."""
    ordered = list(reversed(history.windows))
    if not ordered:
        return ""
    layers = _layer_order([[layer.name for layer in window.layers] for window in history.windows])
    windows = [Window(label=window.received_at.strftime("%m-%d %H:%M:%S"), alert=window.state == "alert",
                      values={layer.name: layer.max_shift for layer in window.layers},
                      statuses={layer.name: layer.status for layer in window.layers}) for window in ordered]
    return timeline_svg(windows, layers, history.rule.shift,
                        f"max standardized shift per layer, last {len(windows)} serving window(s); shaded: alert; hollow: unconverged")


__all__ = ["STATES", "drift_states", "report_state", "shift_timeline", "window_timeline"]
