"""The web charts' text stays inside the chart and off other text, with transformers layer names (issue 35 §3).

The drift legend was cut at the SVG edge (every entry read `resnet.encoder.stages`), the timeline's time labels
overlapped, and the diff's layer titles ran into their summaries. Here each chart is drawn by the functions the pages
use, with the BatchNorm paths of a real transformers ResNet and DETR, rendered in Debian's Chromium, and every <text>
is measured by the browser: inside its SVG's box, and overlapping no other text.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pytest
import torch

from registry.web.svg import ChannelMovement, movement_svg, threshold_bars_svg
from registry.web.timeline_svg import Window, timeline_svg
from tests.registry.web.test_web import browser  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

#: For every <svg>: texts outside its box, and pairs of texts whose boxes overlap (by more than half a pixel).
MEASURE = """svgs => svgs.map(svg => {
  const box = svg.getBoundingClientRect();
  const own = t => [...t.childNodes].filter(n => n.nodeType === 3).map(n => n.nodeValue).join('');  // not its <title>
  const texts = [...svg.querySelectorAll('text')].map(t => ({text: own(t), r: t.getBoundingClientRect()}));
  const outside = texts.filter(t => t.r.left < box.left - 0.5 || t.r.right > box.right + 0.5 || t.r.top < box.top - 0.5
                                    || t.r.bottom > box.bottom + 0.5).map(t => t.text);
  const overlapping = [];
  for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++) {
    const a = texts[i].r, b = texts[j].r;
    const wide = Math.min(a.right, b.right) - Math.max(a.left, b.left), high = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    if (wide > 0.5 && high > 0.5)
      overlapping.push([texts[i].text, texts[j].text]);
  }
  return {cls: svg.getAttribute('class'), count: texts.length, outside, overlapping};
})"""


def _transformers_norm_paths() -> list[str]:
    from transformers import ResNetConfig, ResNetModel

    from tests.real_norms import detr

    resnet = ResNetModel(
        ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 16], depths=[2, 2, 2, 2], layer_type="bottleneck")
    )
    # prefixed as ResNetForImageClassification names them
    names = [f"resnet.{name}" for name, module in resnet.named_modules() if isinstance(module, torch.nn.BatchNorm2d)]
    detr_norms = ("DetrFrozenBatchNorm2d", "LayerNorm")
    return names + [name for name, module in detr().named_modules() if type(module).__name__ in detr_norms]


def _charts(paths: list[str]) -> list[str]:
    rng = np.random.default_rng(0)
    start = datetime(2026, 12, 7, 9, 0, 0)
    layers = paths[:12]
    timelines = []
    for count in (8, 13):  # 8: the newest window's label was drawn beside the one before it
        windows = [
            Window(
                label=(start + timedelta(minutes=7 * i, seconds=13 * i)).strftime("%m-%d %H:%M:%S"),
                alert=i >= count - 3,
                values={name: float(rng.uniform(0, 6)) for name in layers},
                statuses={layers[1]: "unconverged_statistics"},
            )
            for i in range(count)
        ]
        title = f"max standardized shift per layer, last {count} serving window(s); shaded: alert"
        timelines.append(timeline_svg(windows, layers, 3.0, title))
    bars = threshold_bars_svg(
        paths,
        list(rng.uniform(0, 6, len(paths))),
        3.0,
        "max standardized mean shift per layer",
        secondary=list(rng.uniform(0, 3, len(paths))),
        secondary_name="mean over channels",
    )
    movement = movement_svg(
        [
            ChannelMovement(layer=name, mean_shift=rng.normal(size=16), log_var_ratio=rng.normal(size=16))
            for name in paths[:8]
        ]
    )
    return [*timelines, bars, movement]


def test_chart_text_stays_inside_its_chart_and_off_other_text(browser):  # noqa: F811
    paths = _transformers_norm_paths()
    assert max(len(p) for p in paths) > 60 and len(paths) > 20  # resnet.encoder.stages.0.layers.0.layer.0.normalization
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_content(
        "<!doctype html><html><body style='font-family:system-ui,sans-serif'>"
        + "".join(f"<div>{svg}</div>" for svg in _charts(paths))
        + "</body></html>"
    )
    measured = page.locator("svg").evaluate_all(MEASURE)
    assert [m["cls"] for m in measured] == ["timeline-chart", "timeline-chart", "threshold-chart", "movement-plot"]
    for chart in measured:
        assert chart["count"] > 10
        assert chart["outside"] == [], chart["cls"]
        assert chart["overlapping"] == [], chart["cls"]
    legend = page.locator("svg.timeline-chart").first.locator("text.legend")
    legend = legend.evaluate_all("ts => ts.map(t => t.firstChild.nodeValue)")
    assert len(set(legend)) == len(legend) == 12  # the legend's entries differ, as the layers do
    page.close()
