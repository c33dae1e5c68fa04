"""The metrics of one app, in process: their own CollectorRegistry per app, and drift sources read at scrape time.

`history_windows` reads a drift history store's `current(registry)` by attribute; the items here are
plain dataclasses of that shape (the store itself is tested with its own module). The text is read
back with prometheus_client's parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from registry.http.app import create_app
from registry.http.auth import Principal
from registry.http.metrics import DriftObservation, ServiceMetrics, history_windows
from registry.service import Registry


@dataclass
class Layer:
    name: str
    max_shift: float
    max_abs_log_ratio: float
    over: bool


@dataclass
class Window:
    layers: list[Layer]
    received_at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass
class Version:
    model: str
    number: int
    state: str
    last: Window | None


def samples(text: str) -> dict[tuple, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_two_apps_in_one_process_count_their_own_requests(tmp_path):
    apps = [
        create_app(
            Registry(db=f"sqlite:///{tmp_path / f'r{i}.db'}", blobs=str(tmp_path / f"b{i}")),
            insecure_local=True,
            allowed_hosts=["testserver"],
        )
        for i in range(2)
    ]
    first, second = (TestClient(app) for app in apps)
    for _ in range(3):
        assert first.get("/api/v1/models").status_code == 200
    key = ("normbridge_http_requests_total", (("method", "GET"), ("route", "/api/v1/models"), ("status", "200")))
    assert samples(first.get("/metrics").text)[key] == 3
    assert key not in samples(second.get("/metrics").text)


def test_history_windows_override_recorded_reports_and_scoped_callers_see_their_models(tmp_path):
    history = [
        Version(
            "resnet", 3, "warning", Window([Layer("layer1.0.bn1", 0.8, 0.1, True), Layer("bn_last", 0.1, 0.9, False)])
        ),
        Version("other", 1, "alert", None),
    ]

    def older(registry):
        return {("resnet", 3, "layer1.0.bn1"): DriftObservation(9.0, 9.0, "drift", 0.0)}, {("resnet", 3): "alert"}

    metrics = ServiceMetrics(
        Registry(db=f"sqlite:///{tmp_path / 'r.db'}", blobs=str(tmp_path / "b")),
        drift_sources=(older, history_windows(lambda registry: history)),
    )
    everyone = samples(metrics.exposition(Principal(owner="prometheus", role="read")).decode())
    labels = (("layer", "layer1.0.bn1"), ("model", "resnet"), ("version", "3"))
    assert everyone[("normbridge_drift_shift", labels)] == 0.8
    assert everyone[("normbridge_drift_variance_ratio", labels)] == pytest.approx(1.1051709180756477)  # e ** 0.1
    assert everyone[("normbridge_drift_layer_state", labels)] == 2
    assert (
        everyone[("normbridge_drift_layer_state", (("layer", "bn_last"), ("model", "resnet"), ("version", "3")))] == 0
    )
    assert everyone[("normbridge_drift_alert_state", (("model", "resnet"), ("version", "3")))] == 1
    assert everyone[("normbridge_drift_alert_state", (("model", "other"), ("version", "1")))] == 2
    scoped = samples(metrics.exposition(Principal(owner="team", role="read", models=("other",))).decode())
    assert {dict(key[1]).get("model") for key in scoped if key[0].startswith("normbridge_drift")} == {"other"}


def test_pushed_values_are_checked_and_win(tmp_path):
    metrics = ServiceMetrics(Registry(db=f"sqlite:///{tmp_path / 'r.db'}", blobs=str(tmp_path / "b")))
    metrics.drift.observe("cnn", 1, "bn", 0.2, 1.5, "unconverged_statistics")
    metrics.drift.set_alert_state("cnn", 1, "ok")
    with pytest.raises(ValueError, match="not one of"):
        metrics.drift.observe("cnn", 1, "bn", 0.2, 1.5, "ALARM")
    with pytest.raises(ValueError, match="not one of"):
        metrics.drift.set_alert_state("cnn", 1, "red")
    found = samples(metrics.exposition(Principal(owner="p", role="read")).decode())
    assert found[("normbridge_drift_layer_state", (("layer", "bn"), ("model", "cnn"), ("version", "1")))] == 1


def test_drift_series_stop_at_the_cap_keeping_whole_versions_in_alert_and_the_newest_first(tmp_path):
    """Every version that posted a window used to add its series to every scrape, without end: 4,000 versions of 3
    layers made 52,000 drift series. The cap keeps MAX_DRIFT_SERIES, and says how many were left out."""
    from registry.http.metrics import MAX_DRIFT_SERIES

    now = datetime.now(UTC).timestamp()
    layers = [Layer(f"bn{i}", 0.1, 0.1, False) for i in range(3)]
    history = [Version("fleet", n, "ok", Window(layers, datetime.fromtimestamp(now - n, UTC))) for n in range(1, 4001)]
    history.append(Version("stale", 1, "alert", Window([Layer("bn0", 3.0, 0.1, True)], datetime.fromtimestamp(0, UTC))))
    metrics = ServiceMetrics(
        Registry(db=f"sqlite:///{tmp_path / 'r.db'}", blobs=str(tmp_path / "b")),
        drift_sources=(history_windows(lambda registry: history),),
    )
    found = samples(metrics.exposition(Principal(owner="prometheus", role="read")).decode())
    drift = [key for key in found if key[0].startswith("normbridge_drift_")]
    assert MAX_DRIFT_SERIES - 10 < len(drift) <= MAX_DRIFT_SERIES
    assert found[("normbridge_omitted_drift_series", ())] == 4000 * 10 + 4 - len(drift)  # every series is counted once
    versions = {(dict(key[1])["model"], int(dict(key[1])["version"])) for key in drift}
    assert ("stale", 1) in versions  # in alert: kept however old its figures
    fleet = sorted(n for model, n in versions if model == "fleet")
    assert fleet == list(range(1, len(fleet) + 1))  # the newest versions' figures, each version whole
    for n in fleet:
        assert all(
            ("normbridge_drift_shift", (("layer", f"bn{i}"), ("model", "fleet"), ("version", str(n)))) in found
            for i in range(3)
        )
    assert ("normbridge_drift_alert_state", (("model", "fleet"), ("version", str(fleet[-1] + 1)))) not in found
    scoped = samples(metrics.exposition(Principal(owner="team", role="read", models=("stale",))).decode())
    assert scoped[("normbridge_omitted_drift_series", ())] == 0  # the cap counts what the caller may see
