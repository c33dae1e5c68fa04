"""Inline SVG drawn in Python: the lineage graph, per-channel statistics movement, drift bars.

Pages stay light (no JavaScript, no plotting library, no build step) and the pictures are part
of the HTML, so a screenshot or a saved page shows them. Every text that reaches the SVG goes
through `esc`: these strings are inserted into the page unescaped (Jinja2 `|safe`), so this
module is the only place that must escape them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

from schemas.labels import distinct_labels

MUTED = "#6b7280"
AXIS = "#9ca3af"
BLUE = "#2563eb"
ORANGE = "#d97706"
RED = "#dc2626"
GREEN = "#16a34a"
FONT = "font-family='system-ui,sans-serif'"


def esc(text: object) -> str:
    return escape(str(text), quote=True)


def num(value: float, digits: int = 3) -> str:
    """A short number for axis labels and tooltips."""
    if value == 0 or not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}g}"


# --------------------------------------------------------------------------- lineage


@dataclass(frozen=True)
class GraphNode:
    ref: str
    parent: str | None
    depth: int
    operation: str
    note: str | None
    target: bool
    href: str | None  # None: drawn without a link (e.g. a version outside the viewer's scope)
    label: str  # what is written in the box (the ref, or a placeholder for hidden versions)


NODE_W, NODE_H, COL_W, ROW_H = 150, 38, 210, 58


def lineage_svg(nodes: Sequence[GraphNode]) -> str:
    """A left-to-right tree: one row per version in pre-order, each child one column right of its parent.

    Edges run down from the parent and across to the child, labelled with the child's operation
    (fine-tuned, recalibrated, converted, ...). Each box is an <a> to the version's page.
    """
    rows = {node.ref: i for i, node in enumerate(nodes)}
    width = max((node.depth for node in nodes), default=0) * COL_W + NODE_W + 40
    height = len(nodes) * ROW_H + 20
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='lineage' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
        f"role='img' aria-label='lineage graph' {FONT} font-size='13'>"
    ]
    for node in nodes:  # edges first, so boxes are drawn over them
        if node.parent is None or node.parent not in rows:
            continue
        parent = nodes[rows[node.parent]]
        px, py = _box(parent, rows[parent.ref])
        cx, cy = _box(node, rows[node.ref])
        x0, y0, yc = px + 18, py + NODE_H, cy + NODE_H / 2
        parts.append(
            f"<path class='edge' d='M{x0},{y0} V{yc} H{cx}' fill='none' stroke='{AXIS}' stroke-width='1.5' marker-end='url(#arrow)'/>"
        )
        parts.append(
            f"<text class='edge-label' x='{x0 + 8}' y='{yc - 5}' fill='{MUTED}' font-size='11'>{esc(node.operation)}</text>"
        )
    parts.insert(
        1,
        f"<defs><marker id='arrow' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' markerHeight='7' orient='auto'>"
        f"<path d='M0,0 L10,5 L0,10 z' fill='{AXIS}'/></marker></defs>",
    )
    for node in nodes:
        x, y = _box(node, rows[node.ref])
        fill, stroke, weight = ("#dbeafe", BLUE, 2.5) if node.target else ("#ffffff", "#94a3b8", 1.2)
        sub = node.operation if node.parent is None else ""
        if node.note:
            sub = (sub + " · " if sub else "") + node.note
        sub = sub if len(sub) <= 24 else sub[:23] + "…"
        box = (
            f"<rect x='{x}' y='{y}' width='{NODE_W}' height='{NODE_H}' rx='6' fill='{fill}' stroke='{stroke}' stroke-width='{weight}'/>"
            f"<text x='{x + 10}' y='{y + 16}' font-weight='600' fill='#111827'>{esc(node.label)}</text>"
            f"<text x='{x + 10}' y='{y + 31}' font-size='11' fill='{MUTED}'>{esc(sub)}</text>"
            f"<title>{esc(node.label)} ({esc(node.operation)}){' - ' + esc(node.note) if node.note else ''}</title>"
        )
        if node.href is None:
            parts.append(f"<g class='node hidden-node'>{box}</g>")
        else:
            parts.append(f"<a class='node' href='{esc(node.href)}' data-ref='{esc(node.ref)}'>{box}</a>")
    parts.append("</svg>")
    return "".join(parts)


def _box(node: GraphNode, row: int) -> tuple[float, float]:
    return 20 + node.depth * COL_W, 10 + row * ROW_H


# --------------------------------------------------------------------------- per-channel movement


@dataclass(frozen=True)
class ChannelMovement:
    """How one normalizer's running statistics moved from version a to version b, per channel."""

    layer: str
    mean_shift: np.ndarray  # (mean_b - mean_a) / sqrt(var_a + eps)
    log_var_ratio: np.ndarray  # log((var_b + eps) / (var_a + eps))


def movement_svg(layers: Sequence[ChannelMovement], width: int = 760) -> str:
    """Two bar rows per layer: standardized mean shift and log variance ratio of every channel, signed, around zero.

    Each statistic has one scale over all layers, so panels compare at a glance; the scale is
    printed on the left.
    """
    if not layers:
        return ""
    left, panel_h, gap, title_h = 150, 54, 8, 38  # the title on its own line: a long layer path ran into the summary
    plot_w = width - left - 20
    mean_scale = max((float(np.max(np.abs(m.mean_shift))) for m in layers if m.mean_shift.size), default=0.0) or 1.0
    var_scale = (
        max((float(np.max(np.abs(m.log_var_ratio))) for m in layers if m.log_var_ratio.size), default=0.0) or 1.0
    )
    block = title_h + 2 * panel_h + gap + 16
    height = len(layers) * block + 30
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='movement-plot' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
        f"role='img' aria-label='per-channel movement of running statistics' {FONT} font-size='12'>",
        f"<rect x='{left}' y='6' width='10' height='10' fill='{BLUE}'/><text x='{left + 14}' y='15' fill='{MUTED}'>Δ mean / σ (per channel)</text>",
        f"<rect x='{left + 190}' y='6' width='10' height='10' fill='{ORANGE}'/><text x='{left + 204}' y='15' fill='{MUTED}'>log(var_b / var_a) (per channel)</text>",
    ]
    y = 28
    titles = distinct_labels([layer.layer for layer in layers], width // 8)
    for layer, shown in zip(layers, titles):
        parts.append(f"<g class='movement-layer' data-layer='{esc(layer.layer)}'>")
        parts.append(
            f"<text class='layer-title' x='0' y='{y + 14}' font-weight='600' fill='#111827'>{esc(shown)}<title>{esc(layer.layer)}</title></text>"
        )
        parts.append(
            f"<text class='layer-summary' x='{left}' y='{y + 31}' fill='{MUTED}' font-size='11'>{layer.mean_shift.size} channels; "
            f"max |Δmean/σ| {num(float(np.max(np.abs(layer.mean_shift))) if layer.mean_shift.size else 0.0)}, "
            f"max |log var ratio| {num(float(np.max(np.abs(layer.log_var_ratio))) if layer.log_var_ratio.size else 0.0)}</text>"
        )
        top = y + title_h
        parts.append(_signed_bars(layer.mean_shift, left, top, plot_w, panel_h, mean_scale, BLUE, "Δmean/σ"))
        parts.append(
            _signed_bars(
                layer.log_var_ratio, left, top + panel_h + gap, plot_w, panel_h, var_scale, ORANGE, "log var ratio"
            )
        )
        parts.append("</g>")
        y += block
    parts.append("</svg>")
    return "".join(parts)


def _signed_bars(
    values: np.ndarray, x: float, y: float, w: float, h: float, scale: float, colour: str, name: str
) -> str:
    mid = y + h / 2
    parts = [
        f"<rect x='{x}' y='{y}' width='{w}' height='{h}' fill='#f9fafb' stroke='#e5e7eb'/>",
        f"<line x1='{x}' y1='{mid}' x2='{x + w}' y2='{mid}' stroke='{AXIS}' stroke-width='1'/>",
        f"<text x='{x - 6}' y='{y + 10}' text-anchor='end' font-size='10' fill='{MUTED}'>+{num(scale, 2)}</text>",
        f"<text x='{x - 6}' y='{mid + 4}' text-anchor='end' font-size='10' fill='{MUTED}'>{esc(name)} 0</text>",
        f"<text x='{x - 6}' y='{y + h}' text-anchor='end' font-size='10' fill='{MUTED}'>-{num(scale, 2)}</text>",
    ]
    n = max(int(values.size), 1)
    step = w / n
    bar = max(step * 0.8, 0.5)
    for i, value in enumerate(np.asarray(values, dtype=np.float64)):
        v = float(value) if math.isfinite(float(value)) else 0.0
        length = min(abs(v) / scale, 1.0) * (h / 2 - 1)
        top = mid - length if v >= 0 else mid
        parts.append(
            f"<rect class='bar' x='{x + i * step + (step - bar) / 2:.2f}' y='{top:.2f}' width='{bar:.2f}' height='{max(length, 0.0):.2f}' "
            f"fill='{colour}'><title>channel {i}: {num(v, 4)}</title></rect>"
        )
    return "".join(parts)


# --------------------------------------------------------------------------- bars against a threshold


def threshold_bars_svg(
    labels: Sequence[str],
    values: Sequence[float],
    threshold: float,
    title: str,
    secondary: Sequence[float] | None = None,
    secondary_name: str = "",
    width: int = 760,
    href: Callable[[str], str] | None = None,
) -> str:
    """Horizontal bars (one per layer) with a dashed threshold line; bars beyond it are red.

    `secondary` (e.g. the mean over channels next to the max) is drawn as a thin bar inside each.
    """
    left, right, bar_h, gap, top = 210, 70, 18, 8, 44  # room for a 28-character label (schemas/labels.py) at 12 px
    plot_w = width - left - right
    finite = [v for v in list(values) + list(secondary or []) if math.isfinite(v)]
    scale = max(finite + [threshold * 1.25, 1e-12])
    height = top + len(labels) * (bar_h + gap) + 24
    tx = left + threshold / scale * plot_w
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='threshold-chart' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
        f"role='img' aria-label='{esc(title)}' {FONT} font-size='12'>",
        f"<text x='0' y='16' font-weight='600' fill='#111827'>{esc(title)}</text>",
    ]
    if secondary is not None:
        parts.append(
            f"<rect x='0' y='26' width='12' height='4' fill='#111827' opacity='0.55'/>"
            f"<text x='16' y='31' font-size='11' fill='{MUTED}'>{esc(secondary_name)}; bars: max over channels</text>"
        )
    for i, (label, value, shown) in enumerate(zip(labels, values, distinct_labels(labels))):
        y = top + i * (bar_h + gap)
        over = math.isfinite(value) and value > threshold
        length = (min(value, scale) / scale * plot_w) if math.isfinite(value) else plot_w
        text = f"<text x='{left - 8}' y='{y + 13}' text-anchor='end' fill='#111827'>{esc(shown)}<title>{esc(label)}</title></text>"
        if href is not None:
            text = f"<a href='{esc(href(label))}'>{text}</a>"
        parts.append(
            f"<g class='bar-row{' over' if over else ''}' data-layer='{esc(label)}'>{text}"
            f"<rect class='bar' x='{left}' y='{y}' width='{max(length, 0.5):.2f}' height='{bar_h}' fill='{RED if over else GREEN}' rx='2'>"
            f"<title>{esc(label)}: {num(value, 4)}</title></rect>"
        )
        if secondary is not None and i < len(secondary) and math.isfinite(secondary[i]):
            parts.append(
                f"<rect x='{left}' y='{y + bar_h / 2 - 2}' width='{max(min(secondary[i], scale) / scale * plot_w, 0.5):.2f}' height='4' "
                f"fill='#111827' opacity='0.55'/>"
            )
        parts.append(
            f"<text x='{left + max(length, 0.5) + 6:.2f}' y='{y + 13}' fill='{MUTED}' font-size='11'>{num(value)}</text></g>"
        )
    bottom = top + len(labels) * (bar_h + gap)
    parts.append(
        f"<line class='threshold' x1='{tx:.2f}' y1='{top - 6}' x2='{tx:.2f}' y2='{bottom}' stroke='{RED}' stroke-width='1.5' stroke-dasharray='5 4'/>"
        f"<text x='{tx:.2f}' y='{bottom + 14}' text-anchor='middle' fill='{RED}' font-size='11'>threshold {num(threshold)}</text>"
    )
    parts.append(f"<line x1='{left}' y1='{top - 6}' x2='{left}' y2='{bottom}' stroke='{AXIS}'/>")
    parts.append("</svg>")
    return "".join(parts)


__all__ = ["ChannelMovement", "GraphNode", "esc", "lineage_svg", "movement_svg", "threshold_bars_svg"]
