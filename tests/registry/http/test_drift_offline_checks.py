"""Offline drift checks beside the serving state (issue 34 item 14), on a real `normbridge serve` with the real CLI.

Four `normbridge --server URL drift m.pt2 shifted.npy --record m@1` runs, each exiting 11 with "DRIFT in bn", used to
leave the API at state ok with no sign of them beside it, while /metrics exported alert state 2 from the newest report
and the pages showed 'alert': three answers to one question. Now the state is the serving windows' alone, everywhere,
and the newest offline check is shown beside it, labelled as such: in the API (`offline`), on the drift, version and
models pages, and in /metrics (normbridge_drift_offline_verdict). An offline check of a file is not the traffic the
version serves, so it neither raises the state (a what-if file of shifted inputs) nor lowers it: an ONNX version in
alert from its serving windows stays in alert after a clean offline check.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from torch import nn

import converters
from tests.cli_run import invoke_cli, run_cli
from tests.http_server import create_token, running_server
from testkit.monitoring_models import calm, converged, onnx_bn_model, shifted

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
CHECKS = 4


class M(nn.Module):
    """A convolution, the BatchNorm `bn`, a head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from registry.service import Registry

    root = tmp_path_factory.mktemp("offline")
    db, blobs = f"sqlite:///{root / 'registry.db'}", str(root / "blobs")
    registry = Registry(db=db, blobs=blobs, user="ci")
    torch.manual_seed(0)
    model = converged(M())
    torch.export.save(torch.export.export(model, (torch.randn(2, 3, 8, 8),)), str(root / "m.pt2"))
    registry.register("m", model)
    onnx.save(onnx_bn_model(), root / "onx.onnx")
    registry.register("onx", str(root / "onx.onnx"))
    rng = np.random.default_rng(0)
    np.save(root / "shifted.npy", shifted(rng, 64))
    np.save(root / "calm.npy", calm(rng, 64))
    tokens = {
        "writer": create_token(db, "nightly", "write", ["m", "onx"]),
        "reader": create_token(db, "dashboard", "read"),
    }
    with running_server(db=db, blobs=blobs, log=root / "serve.log") as server:
        yield {"server": server, "root": root, "tokens": tokens}


def _drift(env, *args: str, process: bool = False):
    """`normbridge --server URL --token T drift ARGS` as a process, or through the console script's app in this
    process."""
    argv = ["--server", env["server"].url, "--token", env["tokens"]["writer"], "drift", *args]
    if process:
        return run_cli(*argv, cwd=env["root"], env={"NORMBRIDGE_HOME": str(env["root"] / "home")})
    return invoke_cli(*argv, cwd=env["root"], env={"NORMBRIDGE_HOME": str(env["root"] / "home")})


def _read(env, path: str, **params) -> httpx.Response:
    response = httpx.get(
        env["server"].url + path,
        params=params,
        headers={"Authorization": f"Bearer {env['tokens']['reader']}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response


def _page(env, path: str) -> str:
    with httpx.Client(
        base_url=env["server"].url, cookies={"nb_session": env["tokens"]["reader"]}, timeout=60
    ) as browser:
        response = browser.get(path)
    assert response.status_code == 200, response.text[:2000]
    return response.text


def _metrics(env, model: str) -> dict[tuple, float]:
    text = _read(env, "/metrics").text
    return {
        (s.name, s.labels.get("layer")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("model") == model
    }


def _attribute(html: str, element_id: str, name: str) -> str:
    tag = re.search(rf'<[^>]*\bid="{element_id}"[^>]*>', html)
    assert tag, f"no #{element_id} on the page"
    found = re.search(rf'\b{name}="([^"]*)"', tag.group(0))
    assert found, f"#{element_id} has no {name}"
    return found.group(1)


def test_four_offline_drift_checks_are_shown_beside_a_serving_state_they_never_move(env):
    done = [_drift(env, "m.pt2", "shifted.npy", "--record", "m@1", process=i == 0) for i in range(CHECKS)]
    for run in done:
        assert run.returncode == 11 and "DRIFT in bn" in run.stdout and "recorded drift report" in run.stderr, (
            run.stderr[-2000:]
        )

    found = _read(env, "/api/v1/models/m/versions/1/drift").json()
    assert (found["state"], found["windows_total"], found["windows"]) == ("ok", 0, [])
    assert len(found["reports"]) == CHECKS
    series = _metrics(env, "m")
    assert (
        "normbridge_drift_alert_state",
        None,
    ) not in series  # no serving window: no serving state to export (it said 2)
    assert not [key for key in series if key[0] in ("normbridge_drift_shift", "normbridge_drift_layer_state")]
    assert series[("normbridge_drift_offline_verdict", None)] == 2
    offline = found["offline"]
    assert (offline["verdict"], offline["alarms"], offline["checks"], offline["report"]) == (
        "drift",
        ["bn"],
        CHECKS,
        found["reports"][0]["id"],
    )
    assert offline["samples"] == 64 and offline["user"] == "nightly"
    assert all("never counted in it" in run.stderr for run in done)  # the CLI says so when it records

    page = _page(env, "/ui/models/m/versions/1/drift")
    assert (
        _attribute(page, "drift-history-state", "data-state") == "ok"
        and _attribute(page, "drift-history-state", "data-windows") == "0"
    )
    assert "no serving window yet" in page and "never by offline checks" in page
    assert _attribute(page, "drift-offline", "data-verdict") == "drift" and _attribute(
        page, "drift-offline", "data-checks"
    ) == str(CHECKS)
    version = _page(env, "/ui/models/m/versions/1")
    assert _attribute(version, "drift-offline", "data-verdict") == "drift" and 'id="drift-state"' not in version
    row = re.search(r'<tr data-ref="m@1">.*?</tr>', _page(env, "/ui/models/m"), re.S).group(0)
    assert 'data-state="none"' in row and 'data-verdict="drift"' in row and "offline: drift" in row


def test_a_clean_offline_check_does_not_lower_a_serving_alert(env):
    """The same question on the family's other side: an ONNX version alerting on its serving windows,
    then checked offline."""
    session = onnxruntime.InferenceSession(str(env["root"] / "onx.onnx"), providers=["CPUExecutionProvider"])
    watch = converters.monitor(
        session,
        server=env["server"].url,
        token=env["tokens"]["writer"],
        ref="onx@1",
        sample_rate=1.0,
        window_requests=8,
        window_seconds=600,
        seed=0,
    )
    rng = np.random.default_rng(1)
    try:
        for _ in range(3 * 8):
            watch.served.run(None, {"x": shifted(rng)})
        assert watch.flush(30)
    finally:
        watch.close()
    assert _read(env, "/api/v1/models/onx/versions/1/drift").json()["state"] == "alert"

    clean = _drift(env, "onx.onnx", "calm.npy", "--record", "onx@1")
    assert clean.returncode == 0 and "no drift" in clean.stdout, clean.stderr[-2000:]

    found = _read(env, "/api/v1/models/onx/versions/1/drift").json()
    assert (found["state"], found["windows_total"], found["recent"]) == ("alert", 3, "111")
    assert (found["offline"]["verdict"], found["offline"]["checks"]) == ("no drift", 1)
    series = _metrics(env, "onx")
    assert (
        series[("normbridge_drift_alert_state", None)] == 2 and series[("normbridge_drift_offline_verdict", None)] == 0
    )
    assert series[("normbridge_drift_layer_state", "bn")] == 2  # the newest serving window's, not the offline check's
    page = _page(env, "/ui/models/onx/versions/1/drift")
    assert _attribute(page, "drift-history-state", "data-state") == "alert"
    assert _attribute(page, "drift-offline", "data-verdict") == "no drift"
    row = re.search(r'<tr data-ref="onx@1">.*?</tr>', _page(env, "/ui/"), re.S).group(0)
    assert 'data-state="alert"' in row and 'data-verdict="no drift"' in row
