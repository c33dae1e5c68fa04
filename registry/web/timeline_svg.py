"""Each layer's drift over time against the threshold, as inline SVG (no script, like the other charts in svg.py).

One line per layer through its max standardized shift in each window (oldest left): the serving collector's windows from
the drift history, or the recorded offline checks where a version has none. The dashed threshold runs across, every
alert window is shaded, and a point whose layer's statistics never converged is drawn hollow (class `unconverged`):
its height is not drift. Every text goes through `svg.esc`: the SVG is inserted into the page unescaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from schemas.labels import distinct_labels

from .svg import AXIS, FONT, MUTED, RED, esc, num

#: Characters of a legend entry: a long layer path keeps its head and tail around an ellipsis (schemas/labels.py).
LEGEND_CHARS = 24
#: Space each time label takes on the axis (a 14-character timestamp at 10 px), with a gap: labels never overlap.
WINDOW_LABEL_PX = 84

PALETTE = ("#2563eb", "#d97706", "#16a34a", "#7c3aed", "#0891b2", "#be185d", "#4b5563", "#65a30d")


@dataclass(frozen=True)
class Window:
    """One point in time: its label (a timestamp), whether it alerted, each layer's value and status (ok, drift,
    unconverged_statistics; a layer with none given reads ok)."""

    label: str
    alert: bool
    values: dict[str, float]
    statuses: dict[str, str] = field(default_factory=dict)


def _point(layer: str, i: int, px: float, py: float, value: float, status: str, threshold: float, colour: str) -> str:
    """One circle: filled in the layer's colour, hollow when its statistics never converged."""
    classes = (
        "point"
        + (" over" if value > threshold else "")
        + (" unconverged" if status == "unconverged_statistics" else "")
    )
    hollow = status == "unconverged_statistics"
    paint = f"fill='#ffffff' stroke='{colour}' stroke-width='1.5'" if hollow else f"fill='{colour}'"
    note = " (unconverged statistics)" if hollow else ""
    return (
        f"<circle class='{classes}' data-window='{i}' data-status='{esc(status)}' cx='{px:.2f}' cy='{py:.2f}' r='3' {paint}>"
        f"<title>{esc(layer)}: {num(value, 4)}{note}</title></circle>"
    )


def timeline_svg(
    windows: Sequence[Window], layers: Sequence[str], threshold: float, title: str, width: int = 760
) -> str:
    """Lines of each layer's value over `windows` (oldest first) with the threshold; alert windows shaded
    (class alert-window)."""
    left, right, top, plot_h = 56, 190, 36, 220
    plot_w = width - left - right
    height = top + plot_h + 40
    finite = [v for w in windows for v in w.values.values() if math.isfinite(v)]
    scale = max(finite + [threshold * 1.25, 1e-12])
    step = plot_w / max(len(windows), 1)

    def x(i: int) -> float:
        return left + (i + 0.5) * step

    def y(value: float) -> float:
        return top + plot_h - min(value, scale) / scale * plot_h

    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='timeline-chart' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
        f"role='img' aria-label='{esc(title)}' {FONT} font-size='12'>",
        f"<text x='0' y='16' font-weight='600' fill='#111827'>{esc(title)}</text>",
    ]
    for i, window in enumerate(windows):
        if window.alert:
            parts.append(
                f"<rect class='alert-window' data-window='{i}' x='{left + i * step:.2f}' y='{top}' width='{step:.2f}' height='{plot_h}' "
                f"fill='{RED}' opacity='0.12'><title>{esc(window.label)}: alert</title></rect>"
            )
    ty = y(threshold)
    parts.append(
        f"<line class='threshold' x1='{left}' y1='{ty:.2f}' x2='{left + plot_w}' y2='{ty:.2f}' stroke='{RED}' stroke-width='1.5' "
        f"stroke-dasharray='5 4'/><text class='threshold-label' x='{left + plot_w - 4}' y='{ty - 5:.2f}' text-anchor='end' fill='{RED}' "
        f"font-size='11'>threshold {num(threshold)}</text>"
    )
    for rank, (layer, shown) in enumerate(zip(layers, distinct_labels(layers, LEGEND_CHARS))):
        colour = PALETTE[rank % len(PALETTE)]
        points = [
            (i, x(i), y(w.values[layer]), w.values[layer], w.statuses.get(layer, "ok"))
            for i, w in enumerate(windows)
            if math.isfinite(w.values.get(layer, math.nan))
        ]
        path = " ".join(f"{px:.2f},{py:.2f}" for _, px, py, _, _ in points)
        dots = "".join(_point(layer, i, px, py, v, status, threshold, colour) for i, px, py, v, status in points)
        legend_y = top + 12 + rank * 15
        # the legend starts right of the plot, where the whole right margin holds a LEGEND_CHARS label
        # (it was cut at the edge)
        legend = (
            f"<text class='legend' x='{left + plot_w + 12}' y='{legend_y}' fill='{colour}' font-size='11'>{esc(shown)}"
            f"<title>{esc(layer)}</title></text>"
            if legend_y <= top + plot_h
            else ""
        )
        parts.append(
            f"<g class='layer-line' data-layer='{esc(layer)}'><polyline points='{path}' fill='none' stroke='{colour}' stroke-width='1.5'>"
            f"<title>{esc(layer)}</title></polyline>{dots}{legend}</g>"
        )
    bottom = top + plot_h
    parts.append(
        f"<line x1='{left}' y1='{bottom}' x2='{left + plot_w}' y2='{bottom}' stroke='{AXIS}'/>"
        f"<line x1='{left}' y1='{top}' x2='{left}' y2='{bottom}' stroke='{AXIS}'/>"
        f"<text x='{left - 6}' y='{top + 4}' text-anchor='end' fill='{MUTED}' font-size='11'>{num(scale)}</text>"
        f"<text x='{left - 6}' y='{bottom}' text-anchor='end' fill='{MUTED}' font-size='11'>0</text>"
    )
    every = max(1, math.ceil(len(windows) / max(1, plot_w // WINDOW_LABEL_PX)))
    for i, window in enumerate(windows):
        if i % every == 0:  # the newest window's own label only when it falls on the step: it overlapped the one before
            parts.append(
                f"<text class='window-label' x='{x(i):.2f}' y='{bottom + 16}' text-anchor='middle' fill='{MUTED}' font-size='10'>"
                f"{esc(window.label)}</text>"
            )
    parts.append("</svg>")
    return "".join(parts)


__all__ = ["Window", "timeline_svg"]
