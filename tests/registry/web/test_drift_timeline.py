"""The drift page over time, in Chromium: each layer's shift across recorded checks against the threshold, the alert
windows shaded, each layer's status, the recalibrated child linked, and the newest check's verdict beside the serving
state (which offline checks never move) on the version and models pages.

Uses the registry and server of test_web (cnn@3 is recalibrated from cnn@1 there) and records more checks of cnn@1:
traffic like its training inputs twice (its 3 SGD steps left unconverged statistics: not drift), then shifted traffic;
what the chart must show is computed from those reports here.
"""

from __future__ import annotations

import numpy as np
import pytest

from converters.models.monitoring.drift import drift_check
from registry.drift_records import drift_reports, record_drift
from tests.registry.test_registry_service import trained_cnn
from tests.registry.web.test_web import browser, login, shot, site  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def history(site):  # noqa: F811
    rng = np.random.default_rng(5)
    calm = [
        drift_check(trained_cnn(), rng.standard_normal((32, 3, 8, 8)).astype(np.float32)) for _ in range(2)
    ]  # its training inputs
    assert all(report.verdict == "unconverged statistics" for report in calm)  # 3 SGD steps: not drift, and not shaded
    shifted = drift_check(trained_cnn(), (rng.standard_normal((32, 3, 8, 8)) * 3.0 + 2.0).astype(np.float32))
    for report in (*calm, shifted):
        record_drift(site.registry.as_user("collector"), "cnn@1", report)
    return drift_reports(site.registry, "cnn@1")  # newest first, the fixture's own check included


def test_the_drift_page_plots_each_layer_over_time_against_the_threshold(site, browser, history):  # noqa: F811
    newest = history[0].report
    context, page = login(browser, site, start="/ui/models/cnn/versions/1/drift")
    chart = page.locator("#drift-timeline svg.timeline-chart")
    assert chart.is_visible()
    lines = chart.locator("g.layer-line")
    assert sorted(lines.evaluate_all("gs => gs.map(g => g.dataset.layer)")) == sorted(
        layer.name for layer in newest.layers
    )
    alerts = [i for i, record in enumerate(reversed(history)) if record.report.verdict == "drift"]
    assert chart.locator("rect.alert-window").evaluate_all("rs => rs.map(r => Number(r.dataset.window))") == alerts
    assert 0 < len(alerts) < len(history)
    threshold_y = chart.locator("line.threshold").bounding_box()["y"]
    oldest_first = list(reversed(history))
    for i, layer in enumerate(newest.layers):
        points = lines.nth(i).locator("circle.point")
        assert points.count() == len(history)
        for j, record in enumerate(oldest_first):
            value = next(l.max_shift for l in record.report.layers if l.name == layer.name)
            box = points.nth(j).bounding_box()
            assert (box["y"] + box["height"] / 2 < threshold_y) == (value > newest.thresholds.shift), (
                layer.name,
                j,
                value,
            )
    statuses = page.locator("td.layer-status").evaluate_all("ts => ts.map(t => t.dataset.status)")
    assert statuses == [layer.status for layer in newest.layers]
    assert page.locator("#drift-recalibrated a").inner_text() == "cnn@3"
    shot(page, "drift-timeline")

    # Offline checks never move the serving state (cnn@1 has no serving window):
    # their newest verdict is shown beside it.
    assert page.locator("#drift-history-state").get_attribute("data-windows") == "0"
    assert page.locator("#drift-offline").get_attribute("data-verdict") == newest.verdict
    page.goto(site.url + "/ui/models/cnn/versions/1")
    assert page.locator("#drift-state").count() == 0
    assert page.locator("#drift-offline").get_attribute("data-verdict") == newest.verdict
    page.goto(site.url + "/ui/")
    row = page.locator("tr[data-ref='cnn@1'] td.drift-state").first
    assert row.get_attribute("data-state") == "none"
    assert row.locator("a.drift-offline").get_attribute("data-verdict") == newest.verdict
    assert page.locator("tr[data-ref='cnn@2'] td.drift-state").first.get_attribute("data-state") == "none"
    context.close()
