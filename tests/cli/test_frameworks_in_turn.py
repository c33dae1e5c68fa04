"""A `.keras` file, then a `.pt2`, through the processes that outlive one command (issue 31, item 1).

Whatever torch pip installed (with triton, TensorFlow must not be loaded before it: converters/native_order.py), the
warm shared worker registers a `.pt2` after a `.keras` and `normbridge serve` takes a `.pt2` upload after a `.keras`
one, without a crash and without the CLI quietly redoing the work in its own process. On the pinned CPU torch these
hold the ordinary path; `.ci/versions` runs them again beside torch 2.14.1 and triton.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from registry.service import Registry
from tests.cli_process import normbridge_command
from tests.http_server import create_token, running_server
from tests.pt2_crafting import ConvBatchNorm, genuine_pt2
from tests.process_limits import workers_of

pytestmark = pytest.mark.slow  # real CLI processes, a real worker and a real server

ROOT = Path(__file__).resolve().parents[2]
REMOTE_ENV = ("NORMBRIDGE_SERVER", "NORMBRIDGE_TOKEN", "NORMBRIDGE_DB", "NORMBRIDGE_BLOBS", "NORMBRIDGE_FAULT")


def keras_file(path: Path) -> Path:
    """A small `.keras` model with a BatchNormalization holding non-trivial statistics, written by a child process.

    Written in a child so that this test process never loads TensorFlow (the situation the commands must handle is
    theirs, not the test's)."""
    code = (
        "import sys, numpy as np, keras\n"
        "inputs = keras.Input((6, 6, 3))\n"
        "x = keras.layers.Conv2D(4, 3, name='conv')(inputs)\n"
        "bn = keras.layers.BatchNormalization(name='bn')\n"
        "model = keras.Model(inputs, bn(x))\n"
        "rng = np.random.default_rng(0)\n"
        "bn.moving_mean.assign(rng.standard_normal(4).astype('float32'))\n"
        "bn.moving_variance.assign(rng.uniform(0.5, 2, 4).astype('float32'))\n"
        "model.save(sys.argv[1])\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return path


def pt2_file(path: Path) -> Path:
    torch.manual_seed(0)
    model = ConvBatchNorm().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    return genuine_pt2(path, model, (torch.randn(2, 3, 8, 8),))


def normbridge(*args: str, env: dict) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in REMOTE_ENV}
    return subprocess.run(
        normbridge_command() + list(args),
        cwd=ROOT,
        env={**base, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_warm_worker_registers_a_pt2_after_a_keras_file(tmp_path):
    files = keras_file(tmp_path / "k.keras"), pt2_file(tmp_path / "p.pt2")
    folder, home = tmp_path / "workers", tmp_path / "home"
    env = {"NORMBRIDGE_GATE_WORKER": "shared", "NORMBRIDGE_WORKER_DIR": str(folder), "NORMBRIDGE_HOME": str(home)}
    try:
        first = normbridge("register", "k", str(files[0]), env=env)
        assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
        workers = sorted(workers_of(folder))
        assert workers, "the first registration left no warm worker"
        second = normbridge("register", "p", str(files[1]), env=env)
        assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
        assert sorted(workers_of(folder)) == workers, (
            "the warm worker died or was replaced during the .pt2 registration"
        )
    finally:
        for pid in workers_of(folder):
            os.kill(pid, 15)
    registry = Registry(db=f"sqlite:///{home / 'registry.db'}", blobs=str(home / "blobs"))
    for ref in ("k@1", "p@1"):
        [check] = registry.manifest(ref).equivalence
        assert check["passed"] and {o["framework"] for o in check["outputs"]} == {"torch", "keras", "onnx"}


def test_a_server_takes_a_pt2_upload_after_a_keras_one(tmp_path):
    files = keras_file(tmp_path / "k.keras"), pt2_file(tmp_path / "p.pt2")
    db, blobs = f"sqlite:///{tmp_path / 'reg.db'}", str(tmp_path / "blobs")
    with running_server(db=db, blobs=blobs, log=tmp_path / "serve.log") as server:
        token = create_token(db, "alice", "write")
        for name, path in (("k", files[0]), ("p", files[1]), ("k2", files[0])):
            done = normbridge("--server", server.url, "--token", token, "register", name, str(path), env={})
            assert done.returncode == 0, done.stderr[-3000:] + server.log_text()[-3000:]
            assert f"registered {name}@1" in done.stdout
        assert httpx.get(f"{server.url}/api/v1/health", timeout=10).status_code == 200
