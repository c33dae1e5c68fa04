"""A cold `normbridge` process imports only the frameworks its job needs (issue 15).

Registering a .pt2 reads it with torch; with a private worker (what the test suite sets) the ONNX leg runs here and the
Keras leg in the worker, with the shared worker (the CLI's default) both run there, so the command's own process imports
torch alone, and the version still records every check; a second registration finds the shared worker warm and hands it
the whole registration, importing no framework. Inspecting a .pt2 imports neither Keras nor ONNX, inspecting a .keras no
torch, and Keras loads without the optional packages it would import for features normbridge never uses (scikit-learn,
matplotlib, pandas: converters/lean_imports.py), in the CLI and in the shared worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from registry.service import Registry

from tests.pt2_crafting import ConvBatchNorm, genuine_pt2
from tests.process_limits import workers_of

pytestmark = pytest.mark.slow  # runs the CLI in fresh processes

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("keras", "matplotlib", "mlflow", "onnx", "onnxruntime", "pandas", "sklearn", "tensorflow", "torch")
OPTIONAL = ["matplotlib", "pandas", "sklearn"]
#: Runs the CLI in this process, then writes which frameworks it imported to the file $PROBE_OUT.
PROBE = """
import json, os, sys
from cli.main import app
try:
    app(sys.argv[1:], prog_name="normbridge")
    code = 0
except SystemExit as exit:
    code = exit.code
with open(os.environ["PROBE_OUT"], "w") as out:
    json.dump({"exit": code, "imported": [m for m in %r if m in sys.modules]}, out)
""" % (FRAMEWORKS,)


def imports_of(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[int, list[str]]:
    out = tmp_path / "probe.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PROBE_OUT": str(out),
        "NORMBRIDGE_HOME": str(tmp_path / "home"),
        **(env or {}),
    }
    env.pop("NORMBRIDGE_SERVER", None)
    done = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=600)
    assert out.exists(), done.stderr[-2000:]
    found = json.loads(out.read_text())
    assert found["exit"] in (0, None), done.stdout[-2000:] + done.stderr[-2000:]
    return found["exit"], found["imported"]


def test_registering_a_pt2_imports_no_tensorflow_and_still_checks_on_keras(tmp_path):
    torch.manual_seed(0)
    model = ConvBatchNorm().eval()
    pt2 = genuine_pt2(tmp_path / "net.pt2", model, (torch.randn(2, 3, 8, 8),))
    _, imported = imports_of(tmp_path, "register", "net", str(pt2))
    assert imported == ["onnx", "onnxruntime", "torch"]
    _, imported = imports_of(tmp_path, "inspect", str(pt2))
    assert imported == ["torch"]
    home = tmp_path / "home"
    manifest = Registry(db=f"sqlite:///{home / 'registry.db'}", blobs=str(home / "blobs")).manifest("net@1")
    [check] = manifest.equivalence
    assert check["passed"] and [o["framework"] for o in check["outputs"]] == ["torch", "keras", "onnx"]


def test_with_the_shared_worker_a_pt2_registration_imports_torch_alone_and_the_next_one_finds_it_warm(tmp_path):
    torch.manual_seed(0)
    pt2 = genuine_pt2(tmp_path / "net.pt2", ConvBatchNorm().eval(), (torch.randn(2, 3, 8, 8),))
    folder = tmp_path / "workers"
    shared = {"NORMBRIDGE_GATE_WORKER": "shared", "NORMBRIDGE_WORKER_DIR": str(folder)}
    try:
        _, imported = imports_of(tmp_path, "register", "net", str(pt2), env=shared)
        assert imported == ["torch"]
        [worker] = workers_of(folder)
        torch.manual_seed(1)
        other = genuine_pt2(tmp_path / "other.pt2", ConvBatchNorm().eval(), (torch.randn(2, 3, 8, 8),))
        _, imported = imports_of(tmp_path, "register", "other", str(other), env=shared)
        assert imported == [] and workers_of(folder) == [
            worker
        ]  # the warm worker ran the whole registration (registry/worker_jobs.py)
        loaded = Path(
            f"/proc/{worker}/maps"
        ).read_text()  # the worker ran the Keras leg: Keras and TensorFlow, nothing optional
        assert "site-packages/tensorflow/" in loaded
        assert not [name for name in OPTIONAL if f"site-packages/{name}/" in loaded]
    finally:
        for pid in workers_of(folder):
            os.kill(pid, 15)
    home = tmp_path / "home"
    registry = Registry(db=f"sqlite:///{home / 'registry.db'}", blobs=str(home / "blobs"))
    for ref in ("net@1", "other@1"):
        [check] = registry.manifest(ref).equivalence
        assert check["passed"] and [o["framework"] for o in check["outputs"]] == ["torch", "keras", "onnx"]


def test_inspecting_a_keras_file_imports_no_torch(tmp_path):
    from converters.keras_adapter.runtime import import_keras

    keras = import_keras()
    inputs = keras.Input((6, 6, 3))
    model = keras.Model(inputs, keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3)(inputs)))
    model.save(tmp_path / "net.keras")
    _, imported = imports_of(tmp_path, "inspect", str(tmp_path / "net.keras"))
    assert "torch" not in imported and "keras" in imported


def test_keras_loads_without_its_optional_packages_in_the_cli_and_with_them_when_turned_off(tmp_path):
    from converters.keras_adapter.runtime import import_keras

    keras = import_keras()
    inputs = keras.Input((6, 6, 3))
    model = keras.Model(inputs, keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3)(inputs)))
    model.save(tmp_path / "net.keras")
    _, lean = imports_of(tmp_path, "inspect", str(tmp_path / "net.keras"), "--json")
    assert "keras" in lean and "tensorflow" in lean and not [name for name in OPTIONAL if name in lean]
    _, full = imports_of(
        tmp_path, "inspect", str(tmp_path / "net.keras"), "--json", env={"NORMBRIDGE_LEAN_IMPORTS": "0"}
    )
    assert [
        name for name in OPTIONAL if name in full
    ] == OPTIONAL  # installed here (MLflow's), so the lean run kept them out
