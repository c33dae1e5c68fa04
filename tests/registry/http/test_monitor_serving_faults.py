"""Serving faults caught by the first window (issue 35 item 1): a transformers ResNet served in train mode, and a model
holding another version's running statistics, behind `converters.monitor` and a real `normbridge serve` on loopback.

The ResNet is built from a small config with random initialisation and randomized BatchNorm statistics
(tests/real_norms.py). Served after `.train()`, its first window carries a train_mode fault for every BatchNorm (and
statistics_changed: each request rewrote them), the version's state is serving_fault after that one window, without
waiting for k of m, and the API, /metrics, the drift page and `watch.stats()` all say it. A statistics-only v2 of the
same model (same weights, other running statistics) served while monitoring v1 is reported as statistics_mismatch, where
the registry used to refuse the window (409) and nobody heard of it; monitoring v2 with it is fine.
"""

from __future__ import annotations

import copy

import httpx
import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import converters
from registry.drift_history import history
from tests.http_server import create_token, running_server
from tests.real_norms import randomise

pytestmark = pytest.mark.slow

BATCH, WINDOW = 4, 3


def resnet(seed: int = 0):
    from transformers import ResNetConfig, ResNetModel

    config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    return randomise(ResNetModel(config), seed)


def images(rng: np.random.Generator) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32))


def batchnorm_names(model) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from registry.service import Registry

    root = tmp_path_factory.mktemp("serving-faults")
    db, blobs = f"sqlite:///{root / 'registry.db'}", str(root / "blobs")
    registry = Registry(db=db, blobs=blobs, user="ci")
    trained = resnet(0)
    registry.register("resnet", trained)
    moved = copy.deepcopy(trained)  # a statistics-only fine-tune: same weights, other running statistics
    with torch.no_grad():
        for module in moved.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.add_(0.25)
                module.running_var.mul_(1.5)
    registry.register("resnet", moved)
    token = create_token(db, "serving", "write", ["resnet"])
    reader = create_token(db, "dashboard", "read")
    with running_server(db=db, blobs=blobs, log=root / "serve.log") as server:
        yield {"server": server, "token": token, "reader": reader, "registry": registry, "models": (trained, moved)}


def _serve(env, model, ref: str, windows: int = 1):
    watch = converters.monitor(
        model,
        server=env["server"].url,
        token=env["token"],
        ref=ref,
        sample_rate=1.0,
        window_requests=WINDOW,
        window_seconds=600,
        seed=0,
    )
    rng = np.random.default_rng(3)
    try:
        with torch.no_grad():
            for _ in range(windows * WINDOW):
                model(pixel_values=images(rng))
        assert watch.flush(60)
    finally:
        watch.close()
    return watch


def _metrics(env) -> list:
    reader = {"Authorization": f"Bearer {env['reader']}"}
    text = httpx.get(f"{env['server'].url}/metrics", headers=reader, timeout=60).text
    families = text_string_to_metric_families(text)
    return [s for family in families for s in family.samples if s.labels.get("model") == "resnet"]


def _of_v1(samples: list, name: str) -> list:
    return [s for s in samples if s.name == name and s.labels["version"] == "1"]


def test_a_resnet_served_in_train_mode_is_a_serving_fault_from_the_first_window(env):
    served = copy.deepcopy(env["models"][0]).train()  # the classic incident: the serving build forgot model.eval()
    layers = batchnorm_names(served)
    watch = _serve(env, served, "resnet@1")

    body = watch.closed_windows[0]
    kinds = {(fault["kind"], fault.get("layer")) for fault in body["faults"]}
    assert {("train_mode", name) for name in layers} <= kinds
    assert {("statistics_changed", name) for name in layers} <= kinds  # each train-mode request rewrote them
    stats = watch.stats()
    assert (stats.windows_sent, stats.dropped, stats.rejected, stats.errors) == (1, 0, 0, 0), stats
    assert stats.last_state == "serving_fault"
    assert {"train_mode", "statistics_changed", "statistics_mismatch"} == {fault.kind for fault in stats.faults}

    found = history(env["registry"], "resnet@1")
    assert (found.state, found.windows_total) == ("serving_fault", 1)  # one window: no k of m
    assert {fault.layer for fault in found.faults if fault.kind == "train_mode"} == set(layers)
    api = httpx.get(
        f"{env['server'].url}/api/v1/models/resnet/versions/1/drift",
        headers={"Authorization": f"Bearer {env['reader']}"},
        timeout=60,
    ).json()
    assert api["state"] == "serving_fault" and {f["kind"] for f in api["windows"][0]["faults"]} >= {"train_mode"}
    changes = [e.detail for e in env["registry"].audit(model="resnet") if e.action == "drift_state_changed"]
    assert changes[-1]["to"] == "serving_fault" and "train_mode" in changes[-1]["faults"]

    samples = _metrics(env)
    faults = {s.labels["kind"]: s.value for s in _of_v1(samples, "normbridge_serving_fault")}
    assert faults == {"train_mode": 1.0, "statistics_changed": 1.0, "statistics_mismatch": 1.0}
    assert [s.value for s in _of_v1(samples, "normbridge_drift_alert_state")] == [3.0]

    with httpx.Client(base_url=env["server"].url, cookies={"nb_session": env["reader"]}, timeout=60) as browser:
        page = browser.get("/ui/models/resnet/versions/1/drift").text
    assert 'id="serving-fault"' in page and "served in train mode" in page and layers[0] in page

    # served again after model.eval() (a fixed deployment whose statistics are still the trained ones): the fault clears
    fixed = copy.deepcopy(env["models"][0])
    _serve(env, fixed, "resnet@1")
    assert history(env["registry"], "resnet@1").state in ("ok", "warning")


def test_a_model_holding_another_versions_statistics_is_reported_not_dropped(env):
    trained, moved = env["models"]
    watch = _serve(env, copy.deepcopy(moved), "resnet@1")  # v2's statistics, monitored as v1
    assert watch.closed_windows[0]["faults"] == []  # nothing wrong in how it is served: only the registry can tell
    stats = watch.stats()
    assert (stats.windows_sent, stats.dropped, stats.rejected) == (1, 0, 0), stats
    assert stats.last_state == "serving_fault" and [fault.kind for fault in stats.faults] == ["statistics_mismatch"]
    found = history(env["registry"], "resnet@1")
    assert found.state == "serving_fault" and [fault.kind for fault in found.faults] == ["statistics_mismatch"]
    assert found.windows[0].statistics_digest == watch.statistics_digest
    samples = _metrics(env)
    assert {s.labels["kind"] for s in _of_v1(samples, "normbridge_serving_fault")} == {"statistics_mismatch"}

    right = _serve(env, copy.deepcopy(moved), "resnet@2")  # the same model, monitored as the version it is
    own = history(env["registry"], "resnet@2")
    assert right.stats().faults == () and own.windows[0].faults == [] and own.faults == []
    assert own.state in ("ok", "warning")  # the drift rule's (random images, random statistics): no serving fault
