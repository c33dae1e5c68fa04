"""The drift page over the serving collector's windows, in Chromium: a real `normbridge serve`, windows posted over
HTTP as a collector posts them, and the timeline read back from the page.

The version is a converged CNN whose second BatchNorm was reset to its initial statistics (mean 0, variance 1, no
batch tracked): its first layer drifts on shifted traffic and the version reaches alert on the third shifted window,
while the second layer reads unconverged_statistics in every window (drawn hollow, never counted). What the chart
must show is taken from the windows the server answered with.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from tests.http_server import create_token, running_server
from tests.registry.web.test_web import Site, browser, login, readme_copy, shot  # noqa: F401  (fixtures)
from testkit.monitoring_models import calm, served_window, shifted, torch_cnn

pytestmark = pytest.mark.slow

CALM, SHIFTED = 2, 4


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from registry.service import Registry

    folder = tmp_path_factory.mktemp("drift-windows")
    db, blobs = f"sqlite:///{folder / 'registry.db'}", str(folder / "blobs")
    registry = Registry(db=db, blobs=blobs, user="alice")
    model = torch_cnn()
    model.bn2.reset_running_stats()  # never tracked a batch: unconverged_statistics whatever it is served
    registry.register("live", model, note="bn2 never trained")
    tokens = {"reader": create_token(db, "reader", "read"), "writer": create_token(db, "serving", "write", ["live"])}
    rng = np.random.default_rng(11)
    bodies = [served_window(model, calm(rng, 32)) for _ in range(CALM)] + [
        served_window(model, shifted(rng, 32)) for _ in range(SHIFTED)
    ]
    with running_server(db=db, blobs=blobs, log=folder / "serve.log") as server:
        url = f"{server.url}/api/v1/models/live/versions/1/drift"
        stored = []
        for body in bodies:
            answer = httpx.post(url, json=body, headers={"Authorization": f"Bearer {tokens['writer']}"}, timeout=30)
            assert answer.status_code == 201, answer.text
            stored.append(answer.json())
        yield Site(server, registry, tokens, None, db), stored
    registry.meta.close()


def test_the_drift_page_plots_the_serving_windows(live, browser):  # noqa: F811
    site, stored = live
    assert [w["state"] for w in stored] == ["ok"] * CALM + ["warning", "warning", "alert", "alert"]
    context, page = login(browser, site, start="/ui/models/live/versions/1/drift")
    assert page.locator("#drift-history-state").get_attribute("data-state") == "alert"
    chart = page.locator("#drift-timeline svg.timeline-chart")
    assert chart.is_visible()
    lines = chart.locator("g.layer-line")
    names = [layer["name"] for layer in stored[-1]["layers"]]
    assert lines.evaluate_all("gs => gs.map(g => g.dataset.layer)") == names
    threshold_y = chart.locator("line.threshold").bounding_box()["y"]
    for i, name in enumerate(names):
        points = lines.nth(i).locator("circle.point")
        assert points.count() == len(stored)  # one point per window recorded
        for j, window in enumerate(stored):
            layer = next(l for l in window["layers"] if l["name"] == name)
            box = points.nth(j).bounding_box()
            assert (box["y"] + box["height"] / 2 < threshold_y) == (layer["max_shift"] > 0.5), (
                name,
                j,
                layer["max_shift"],
            )
            assert points.nth(j).get_attribute("data-status") == layer["status"]
    statuses = {name: {l["status"] for w in stored for l in w["layers"] if l["name"] == name} for name in names}
    assert statuses == {"bn1": {"ok", "drift"}, "bn2": {"unconverged_statistics"}}, statuses
    assert chart.locator("circle.unconverged").count() == len(stored)  # bn2's points, hollow
    alerts = [j for j, window in enumerate(stored) if window["state"] == "alert"]
    assert (
        chart.locator("rect.alert-window").evaluate_all("rs => rs.map(r => Number(r.dataset.window))")
        == alerts
        == [4, 5]
    )
    shown = page.locator("td.window-status").evaluate_all("ts => ts.map(t => t.dataset.status)")
    assert shown == [layer["status"] for layer in stored[-1]["layers"]]
    readme_copy(shot(page, "drift-windows"), "drift-windows.png")

    page.goto(site.url + "/ui/models/live/versions/1")
    assert page.locator("#drift-state").inner_text() == "alert"
    page.goto(site.url + "/ui/")
    assert page.locator("tr[data-ref='live@1'] td.drift-state").first.get_attribute("data-state") == "alert"
    context.close()


def test_a_production_version_in_drift_alert_shows_the_alert_not_a_green_headline(live, browser):  # noqa: F811
    """Issue 35 §3: the version page's headline read "equivalence passed, servable" in green above a version in
    alert."""
    site, stored = live
    assert stored[-1]["state"] == "alert"
    site.registry.set_alias("live", "production", "1", force=True)  # bn2 never trained: only a forced alias holds it
    context, page = login(browser, site, start="/ui/models/live/versions/1")
    headline = page.locator("h1")
    assert headline.locator(".badge", has_text="production").count() == 1
    assert headline.locator("#drift-alert").inner_text() == "drift alert"
    assert headline.locator("#drift-alert").evaluate("e => getComputedStyle(e).color") == "rgb(220, 38, 38)"  # --red
    assert headline.locator(".verdict.passed, .verdict.servable").count() == 0  # nothing green above the alert
    assert "Drift alert." in page.locator("#drift-alert-note").inner_text()
    context.close()
