"""What the pages show of drift: a version's serving state, its newest offline check beside it, and each layer's shift
over time.

The state is the drift history's, as the API gives it: ok, warning or alert, moved by serving windows only (the
sustained-shift rule), or serving_fault, shown as a red banner naming each fault and its layers (`fault_banner`).
A recorded offline check (`normbridge drift --record`) never moves it: its verdict is shown beside the state, labelled
offline, and a version with no serving window shows no state, only that verdict. The
timeline plots the serving windows, or the recorded checks where there are no windows.
"""

from __future__ import annotations

from dataclasses import dataclass

from registry.drift_history import states as history_states
from registry.drift_records import latest_drift_reports

from .timeline_svg import Window, timeline_svg

#: A check's verdict -> the colour class its headline takes.
STATES = {"drift": "alert", "unconverged statistics": "unconverged", "no drift": "ok"}


def report_state(report) -> str:
    return STATES.get(report.verdict, "ok")


#: A serving fault kind -> what the banner says of it, and what to do.
FAULT_WORDS = {
    "train_mode": (
        "served in train mode",
        "each request is normalized by its own batch; call model.eval() before serving",
    ),
    "statistics_changed": (
        "running statistics changed while serving",
        "something updates them (train mode, a training loop)",
    ),
    "batch_statistics_in_graph": (
        "the served graph computes batch statistics",
        "a training-mode batch norm was exported; export after model.eval()",
    ),
    "statistics_mismatch": (
        "served statistics are not this version's",
        "the served model holds another version's running statistics; serve this version, or monitor the one served",
    ),
}
#: Layers a banner line names before it says how many more there are.
BANNER_LAYERS = 5


@dataclass(frozen=True)
class FaultLine:
    """One line of the serving fault banner: a kind, what it means, what to do, the layers it was seen in."""

    kind: str
    what: str
    todo: str
    layers: list[str]
    more: int


def fault_banner(history) -> list[FaultLine]:
    """One FaultLine per fault kind of a DriftHistory in state serving_fault (its newest window's), layers elided past
    a few."""
    if history.state != "serving_fault":
        return []
    by_kind: dict[str, list[str]] = {}
    for fault in history.faults:
        names = by_kind.setdefault(fault.kind, [])
        if fault.layer and fault.layer not in names:
            names.append(fault.layer)
    lines = []
    for kind, names in by_kind.items():
        what, todo = FAULT_WORDS.get(kind, (kind, ""))
        lines.append(FaultLine(kind, what, todo, names[:BANNER_LAYERS], max(0, len(names) - BANNER_LAYERS)))
    return lines


@dataclass(frozen=True)
class DriftBadge:
    """What a version's row shows: its serving state (None without serving windows) and its newest offline check's
    verdict."""

    serving: str | None
    offline: str | None


def drift_states(registry) -> dict[tuple[str, int], DriftBadge]:
    """(model, number) -> DriftBadge for every version with serving windows or a recorded check (two queries)."""
    offline = {(record.model, record.number): record.report.verdict for record in latest_drift_reports(registry.meta)}
    serving = history_states(registry)
    return {key: DriftBadge(serving.get(key), offline.get(key)) for key in serving.keys() | offline.keys()}


def _layer_order(newest_first: list[list[str]]) -> list[str]:
    """The newest entry's layers first, then any only older entries had."""
    return list(dict.fromkeys(name for names in newest_first for name in names))


def shift_timeline(records) -> str:
    """Each layer's max standardized shift in every recorded check (records newest first, drawn oldest first) against
    the threshold."""
    ordered = list(reversed(records))
    if not ordered:
        return ""
    layers = _layer_order([[layer.name for layer in record.report.layers] for record in records])
    windows = [
        Window(
            label=record.created_at.strftime("%m-%d %H:%M:%S"),
            alert=record.report.verdict == "drift",
            values={layer.name: layer.max_shift for layer in record.report.layers},
            statuses={layer.name: layer.status for layer in record.report.layers},
        )
        for record in ordered
    ]
    threshold = ordered[-1].report.thresholds.shift
    return timeline_svg(
        windows,
        layers,
        threshold,
        f"max standardized mean shift per layer over {len(windows)} recorded check(s); shaded: drift",
    )


def window_timeline(history) -> str:
    """Each layer's max standardized shift in every serving window of a DriftHistory (newest first, drawn oldest first)
    against the rule's shift threshold; a window after which the version was in alert is shaded."""
    ordered = list(reversed(history.windows))
    if not ordered:
        return ""
    layers = _layer_order([[layer.name for layer in window.layers] for window in history.windows])
    windows = [
        Window(
            label=window.received_at.strftime("%m-%d %H:%M:%S"),
            alert=window.state == "alert",
            values={layer.name: layer.max_shift for layer in window.layers},
            statuses={layer.name: layer.status for layer in window.layers},
        )
        for window in ordered
    ]
    return timeline_svg(
        windows,
        layers,
        history.rule.shift,
        f"max standardized shift per layer, last {len(windows)} serving window(s); shaded: alert; hollow: unconverged",
    )


__all__ = [
    "DriftBadge",
    "FAULT_WORDS",
    "FaultLine",
    "STATES",
    "drift_states",
    "fault_banner",
    "report_state",
    "shift_timeline",
    "window_timeline",
]
