"""The drift page's timeline built from serving windows, without a browser: one point per layer per window, heights on a
linear scale read back from the SVG's own axis and threshold line, alert windows shaded, unconverged points hollow.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest

from registry.web.drift_view import window_timeline
from schemas.monitoring import DriftHistory, DriftRule, LayerShift, WindowRecord

SVG = "{http://www.w3.org/2000/svg}"
#: Oldest first: (bn1's max shift, bn1's status, bn2's max shift, bn2's status, the state after the window).
ROWS = [
    (0.1, "ok", 0.9, "unconverged_statistics", "ok"),
    (0.2, "ok", 1.1, "unconverged_statistics", "ok"),
    (1.5, "drift", 1.0, "unconverged_statistics", "warning"),
    (2.0, "drift", 0.8, "unconverged_statistics", "warning"),
    (3.0, "drift", 1.2, "unconverged_statistics", "alert"),
    (0.3, "ok", 0.7, "unconverged_statistics", "alert"),
]


def _layer(name: str, shift: float, status: str) -> LayerShift:
    return LayerShift(
        name=name,
        channels=4,
        count=100,
        max_shift=shift,
        mean_shift=shift / 2,
        worst_shift_channel=0,
        variance_ratio=1.0,
        max_abs_log_ratio=0.0,
        over=shift > 0.5,
        status=status,
    )


def _history() -> DriftHistory:
    start = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    windows = [
        WindowRecord(
            id=i + 1,
            received_at=start + timedelta(minutes=i),
            started_at=start,
            ended_at=start,
            replica="r",
            user="u",
            requests=10,
            sampled=1,
            dropped=0,
            statistics_digest=None,
            over=s1 == "drift",
            state=state,
            layers=[_layer("features.bn1", a, s1), _layer("features.bn2", b, s2)],
        )
        for i, (a, s1, b, s2, state) in enumerate(ROWS)
    ]
    return DriftHistory(
        model="m",
        number=1,
        state="alert",
        rule=DriftRule(),
        windows_total=len(ROWS),
        recent="00111",
        windows=list(reversed(windows)),
    )  # the store answers newest first


def test_each_window_is_a_point_on_a_linear_scale_against_the_threshold():
    root = ET.fromstring(window_timeline(_history()))
    threshold = root.find(f".//{SVG}line[@class='threshold']")
    threshold_y = float(threshold.get("y1"))
    bottom = max(
        float(line.get("y1"))
        for line in root.iter(f"{SVG}line")
        if line.get("y1") == line.get("y2") and line.get("class") is None
    )
    lines = {
        g.get("data-layer"): g.findall(f"{SVG}circle") for g in root.iter(f"{SVG}g") if g.get("class") == "layer-line"
    }
    assert set(lines) == {"features.bn1", "features.bn2"}
    for column, name in ((0, "features.bn1"), (2, "features.bn2")):
        points = lines[name]
        assert [int(p.get("data-window")) for p in points] == list(range(len(ROWS)))  # one per window, oldest left
        xs = [float(p.get("cx")) for p in points]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)
        for point, row in zip(points, ROWS):
            value, status = row[column], row[column + 1]
            height = (bottom - float(point.get("cy"))) / (
                bottom - threshold_y
            )  # in thresholds: the axis is linear from 0
            assert height == pytest.approx(value / DriftRule().shift, abs=0.01)
            assert ("over" in point.get("class").split()) == (value > DriftRule().shift)
            assert point.get("data-status") == status
            assert ("unconverged" in point.get("class").split()) == (status == "unconverged_statistics")
            assert (point.get("fill") == "#ffffff") == (status == "unconverged_statistics")  # hollow
    shaded = [int(r.get("data-window")) for r in root.iter(f"{SVG}rect") if r.get("class") == "alert-window"]
    assert shaded == [i for i, row in enumerate(ROWS) if row[4] == "alert"] == [4, 5]


def test_no_windows_no_chart():
    assert window_timeline(_history().model_copy(update={"windows": []})) == ""
