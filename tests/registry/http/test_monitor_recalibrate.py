"""Closing the loop over HTTP: the collector keeps a sample of shifted traffic,
`normbridge recalibrate` registers a child.

A torch CNN registered as cnn@1 is served with `monitor(..., keep_sample=N)` against a real `normbridge serve` until its
history alerts; the kept sample is saved as .npz and given, as it is, to the real `normbridge --server URL --token T
recalibrate cnn.pt2 traffic.npz --register cnn@1`, which registers cnn@2 as a 'recalibrated' child whose diff says
weights identical, running statistics changed. The first BatchNorm's new running mean and variance are checked against
NumPy over the kept inputs (the convolution before it computed in NumPy from the weights), and the recalibrated program,
served with the collector on the same traffic, keeps cnn@2's history ok.
"""

from __future__ import annotations

import json
import subprocess

import httpx
import numpy as np
import pytest
import torch

import converters
from registry.service import Registry
from tests.cli_process import normbridge_command
from tests.http_server import create_token, running_server
from testkit.monitoring_models import shifted, torch_cnn

pytestmark = pytest.mark.slow

WINDOW, KEEP, BATCH_SIZE = 8, 64, 16  # KEEP rows are 16 requests of 4: the last 16 of the 32 served
BATCH = torch.export.Dim("batch", min=1, max=1024)


def _conv_numpy(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """A 3x3 convolution with padding 1, stride 1, no bias, in float64 (N,C,H,W) -> (N,O,H,W)."""
    n, c, h, w = x.shape
    padded = np.zeros((n, c, h + 2, w + 2))
    padded[:, :, 1:-1, 1:-1] = x
    out = np.zeros((n, weight.shape[0], h, w))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", padded[:, :, i : i + h, j : j + w], weight[:, :, i, j])
    return out


def _history(server, token: str, ref: str) -> dict:
    name, number = ref.split("@")
    return httpx.get(
        f"{server.url}/api/v1/models/{name}/versions/{number}/drift",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    ).json()


def test_a_kept_sample_recalibrates_into_a_registered_child_that_stops_the_alert(tmp_path):
    model = torch_cnn()
    program = torch.export.export(
        model, (torch.from_numpy(shifted(np.random.default_rng(0))),), dynamic_shapes=({0: BATCH},)
    )
    torch.export.save(program, tmp_path / "cnn.pt2")
    db, blobs = f"sqlite:///{tmp_path / 'registry.db'}", str(tmp_path / "blobs")
    Registry(db=db, blobs=blobs, user="ci").register("cnn", str(tmp_path / "cnn.pt2"))
    writer, reader = create_token(db, "serving", "write", ["cnn"]), create_token(db, "dashboard", "read")
    rng = np.random.default_rng(1)
    traffic = [shifted(rng) for _ in range(4 * WINDOW)]

    with running_server(db=db, blobs=blobs, log=tmp_path / "serve.log") as server:
        watch = converters.monitor(
            model,
            server=server.url,
            token=writer,
            ref="cnn@1",
            sample_rate=1.0,
            window_requests=WINDOW,
            window_seconds=600,
            keep_sample=KEEP,
        )
        with torch.no_grad():
            for batch in traffic:
                model(torch.from_numpy(batch))
        assert watch.flush(30)
        rows = watch.save_sample(tmp_path / "traffic.npz")
        watch.close()
        assert rows == KEEP and _history(server, reader, "cnn@1")["state"] == "alert"

        command = [
            *normbridge_command(),
            "--server",
            server.url,
            "--token",
            writer,
            "recalibrate",
            str(tmp_path / "cnn.pt2"),
            str(tmp_path / "traffic.npz"),
            "-o",
            str(tmp_path / "new.pt2"),
            "--batch-size",
            str(BATCH_SIZE),
            "--register",
            "cnn@1",
            "--json",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr + done.stdout
        report = json.loads(done.stdout)
        assert (report["registered"], report["version"], report["parent"]) == (True, "cnn@2", "cnn@1")
        assert report["diff"] == "weights identical, running statistics changed in 2 layers"
        assert (report["samples"], report["batches"]) == (KEEP, KEEP // BATCH_SIZE)
        child = Registry(db=db, blobs=blobs).show("cnn@2")
        assert (
            child.parent == "cnn@1"
            and child.operation == "recalibrated"
            and f"{KEEP} samples of traffic.npz" in child.note
        )

        recalibrated = torch.export.load(tmp_path / "new.pt2")
        again = converters.monitor(
            recalibrated,
            server=server.url,
            token=writer,
            ref="cnn@2",
            sample_rate=1.0,
            window_requests=WINDOW,
            window_seconds=600,
        )
        with torch.no_grad():
            for batch in traffic[-3 * WINDOW :]:
                again.served(torch.from_numpy(batch))
        assert again.flush(30)
        again.close()
        assert again.stats().windows_sent == 3 and _history(server, reader, "cnn@2")["state"] == "ok"

    kept = np.concatenate(traffic)[-KEEP:].astype(np.float64)  # sample_rate=1.0: the newest KEEP rows served
    with np.load(tmp_path / "traffic.npz") as saved:
        np.testing.assert_array_equal(saved["x"], kept.astype(np.float32))
    weight = model.conv1.weight.detach().double().numpy()
    inputs = _conv_numpy(kept, weight)
    expected_mean = inputs.mean(
        axis=(0, 2, 3)
    )  # the population statistics of all the kept rows, whatever the batch size
    expected_var = inputs.var(axis=(0, 2, 3), ddof=1)  # unbiased: times n / (n - 1) for the n values per channel in all
    state = recalibrated.state_dict
    np.testing.assert_allclose(state["bn1.running_mean"].double().numpy(), expected_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["bn1.running_var"].double().numpy(), expected_var, rtol=1e-5)
    np.testing.assert_array_equal(state["conv1.weight"].detach().numpy(), model.conv1.weight.detach().numpy())
