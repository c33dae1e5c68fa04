"""GET /metrics on a real `normbridge serve`: the Prometheus text format, read back with prometheus_client's own parser.

Counters are compared before and after real requests (so the test does not depend on what other
requests the fixture made); labels must be route templates, never raw paths; a drift report recorded against a
version exports its verdict apart from the serving series (which only serving windows feed), and a token scoped to
another model does not see it.
"""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from converters.models.monitoring.drift import drift_check
from registry.drift_records import record_drift
from tests.http_server import create_token, running_server
from tests.registry.http.test_http_api import (
    assert_error,
    bearer,
    failing_gate_bundle,
    onnx_bytes,
    pt2_bytes,
    small_model,
)

pytestmark = pytest.mark.slow  # starts a server


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from registry.service import Registry

    root = tmp_path_factory.mktemp("metrics")
    db, blobs = f"sqlite:///{root / 'registry.db'}", str(root / "blobs")
    tokens = {
        "writer": create_token(db, "ci-bot", "write"),
        "prometheus": create_token(db, "prometheus", "read"),
        "other_reader": create_token(db, "other-team", "read", models=["other"]),
    }
    with running_server(db=db, blobs=blobs, log=root / "serve.log") as server:
        clients = {
            role: httpx.Client(base_url=server.url, headers=bearer(token), timeout=180)
            for role, token in tokens.items()
        }
        yield {
            "server": server,
            "root": root,
            "clients": clients,
            "registry": Registry(db=db, blobs=blobs, user="nightly"),
        }
        for client in clients.values():
            client.close()


def scrape(client: httpx.Client) -> dict[str, dict[tuple, float]]:
    """Every sample of GET /metrics as {sample name: {sorted label items: value}}, parsed by prometheus_client."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


def test_metrics_need_a_token(env):
    with httpx.Client(base_url=env["server"].url, timeout=60) as anonymous:
        assert_error(anonymous.get("/metrics"), 401, "unauthorized")
        assert_error(anonymous.get("/metrics", headers=bearer("nbt_nope_nope")), 401, "unauthorized")


def test_requests_are_counted_by_route_template_and_status(env):
    prometheus = env["clients"]["prometheus"]
    route = "/api/v1/models/{name}/versions/{ref}"
    before = scrape(prometheus)
    for ref in ("1", "2", "production"):
        assert prometheus.get(f"/api/v1/models/never-registered-{ref}/versions/{ref}").status_code == 404
    assert prometheus.get("/no/such/page/abc123").status_code == 404
    after = scrape(prometheus)
    assert (
        value(after, "normbridge_http_requests_total", method="GET", route=route, status="404")
        == value(before, "normbridge_http_requests_total", method="GET", route=route, status="404") + 3
    )
    assert (
        value(after, "normbridge_http_requests_total", method="GET", route="unmatched", status="404")
        >= value(before, "normbridge_http_requests_total", method="GET", route="unmatched", status="404") + 1
    )
    assert (
        value(after, "normbridge_http_request_duration_seconds_count", method="GET", route=route)
        == value(before, "normbridge_http_request_duration_seconds_count", method="GET", route=route) + 3
    )
    routes = {dict(labels)["route"] for labels in after["normbridge_http_requests_total"]}
    assert not any("never-registered" in r or "abc123" in r for r in routes), (
        routes
    )  # templates only: a bounded label set
    assert value(after, "normbridge_http_requests_total", method="GET", route="/metrics", status="200") >= 1


def test_registrations_are_counted_by_outcome_and_the_gate_is_timed(env):
    writer, prometheus, root = env["clients"]["writer"], env["clients"]["prometheus"], env["root"]
    before = scrape(prometheus)
    model = pt2_bytes(small_model(seed=3), root)
    assert writer.post("/api/v1/models/cnn/versions", params={"format": "pt2"}, content=model).status_code == 201
    assert writer.post("/api/v1/models/cnn/versions", params={"format": "pt2"}, content=model).status_code == 200
    assert_error(
        writer.post("/api/v1/models/cnn/versions", params={"format": "bundle"}, content=failing_gate_bundle(root)),
        409,
        "check_failed",
    )
    assert_error(
        writer.post("/api/v1/models/cnn/versions", params={"format": "onnx"}, content=b"not an onnx file"),
        400,
        "bad_input_file",
    )
    after = scrape(prometheus)
    for outcome, moved in (("created", 1), ("existing", 1), ("refused", 1), ("rejected", 1)):
        assert (
            value(after, "normbridge_registrations_total", outcome=outcome)
            == value(before, "normbridge_registrations_total", outcome=outcome) + moved
        ), outcome
    assert (
        value(after, "normbridge_gate_duration_seconds_count", outcome="passed")
        >= value(before, "normbridge_gate_duration_seconds_count", outcome="passed") + 1
    )
    assert (
        value(after, "normbridge_gate_duration_seconds_count", outcome="failed")
        == value(before, "normbridge_gate_duration_seconds_count", outcome="failed") + 1
    )
    assert value(after, "normbridge_gate_duration_seconds_sum", outcome="passed") > value(
        before, "normbridge_gate_duration_seconds_sum", outcome="passed"
    )


@pytest.fixture(scope="module")
def shifted(env):
    """served@1 with two drift reports recorded against it, a calm one then a shifted one; returns the shifted
    (newest) report."""
    writer, registry = env["clients"]["writer"], env["registry"]
    assert writer.post(
        "/api/v1/models/other/versions", params={"format": "onnx"}, content=onnx_bytes()
    ).status_code in (200, 201)
    assert (
        writer.post(
            "/api/v1/models/served/versions",
            params={"format": "pt2"},
            content=pt2_bytes(small_model(seed=5), env["root"]),
        ).status_code
        == 201
    )
    model = small_model(seed=5)
    rng = np.random.default_rng(0)
    record_drift(registry, "served@1", drift_check(model, rng.standard_normal((256, 3)).astype(np.float32)))
    report = drift_check(model, (rng.standard_normal((256, 3)) * 3 + 4).astype(np.float32))
    assert report.verdict == "drift"
    record_drift(registry, "served@1", report)  # the newer report is the one exported
    return report


def test_the_newest_recorded_report_exports_its_verdict_apart_from_the_serving_series_within_the_token_scope(
    env, shifted
):
    samples = scrape(env["clients"]["prometheus"])
    assert (
        value(samples, "normbridge_drift_offline_verdict", model="served", version="1") == 2
    )  # the newest report found drift
    for name in (
        "normbridge_drift_shift",
        "normbridge_drift_variance_ratio",
        "normbridge_drift_layer_state",
        "normbridge_drift_alert_state",
    ):
        assert not [labels for labels in samples.get(name, {}) if dict(labels)["model"] == "served"], (
            name
        )  # no serving window: none

    scoped = scrape(env["clients"]["other_reader"])
    assert not [
        labels
        for name in ("normbridge_drift_offline_verdict", "normbridge_drift_alert_state")
        for labels in scoped.get(name, {})
        if dict(labels)["model"] != "other"
    ]
    assert "normbridge_http_requests_total" in scoped  # service metrics carry no model name


def test_the_drift_page_shows_each_layers_status_and_links_the_recalibrated_child(env, shifted):
    writer = env["clients"]["writer"]
    child = writer.post(
        "/api/v1/models/served/versions",
        params={
            "format": "pt2",
            "parent": "served@1",
            "operation": "recalibrated",
            "note": "recalibrated on recent traffic",
        },
        content=pt2_bytes(small_model(seed=6), env["root"]),
    )
    assert child.status_code == 201, child.text
    number = child.json()["version"]["number"]
    token = env["clients"]["prometheus"].headers["authorization"].removeprefix("Bearer ")
    with httpx.Client(base_url=env["server"].url, cookies={"nb_session": token}, timeout=60) as browser:
        page = browser.get("/ui/models/served/versions/1/drift")
    assert page.status_code == 200, page.text
    report = shifted  # the page shows the newest report
    statuses = re.findall(r'class="layer-status" data-status="([a-z_]+)"', page.text)
    assert statuses == [layer.status for layer in report.layers] and "drift" in statuses
    assert f'href="/ui/models/served/versions/{number}"' in page.text and "recalibrated on recent traffic" in page.text
