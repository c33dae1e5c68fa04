"""The registry commands: register .pt2 files, read, diff, lineage, alias, verify, audit, gc, bad input.

A registration, a tampered blob and a Keras export run as real processes; the other rows run the console
script's app in this process (tests.cli_run.invoke_cli), the same parsing, command and exit-status mapping.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.numpy import load_file

from schemas import load_spec

from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli
from tests.registry.test_registry_service import (
    blob_path,
    finetune_statistics,
    save_pt2,
    trained_cnn,
)

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

ROOT = Path(__file__).resolve().parents[2]


def command() -> list[str]:
    return normbridge_command()


@pytest.fixture
def cli(tmp_path):
    """run(*args, process=False): a CompletedProcess on a registry in tmp_path selected by env NORMBRIDGE_DB /
    NORMBRIDGE_BLOBS.

    In this process (tests.cli_run.invoke_cli: the console script's app) unless `process`: then a real `normbridge`
    process, for the rows whose exit status and start-up are the behaviour
    (a registration, a tampered blob, a Keras export).
    """
    registry_env = {
        "NORMBRIDGE_DB": f"sqlite:///{tmp_path / 'reg.db'}",
        "NORMBRIDGE_BLOBS": str(tmp_path / "blobs"),
        "NORMBRIDGE_USER": "cli-user",
    }
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **registry_env, "COLUMNS": "200"}
    env.pop("NORMBRIDGE_FAULT", None)

    def run(*args: str, process: bool = False) -> subprocess.CompletedProcess:
        if not process:
            return invoke_cli(*args, cwd=ROOT, columns=200, env=registry_env)
        return subprocess.run(
            command() + list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
        )

    return run


def data(run: subprocess.CompletedProcess):
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_register_read_diff_lineage_alias_verify_audit_gc(cli, tmp_path):
    model = trained_cnn()
    v1 = save_pt2(model, tmp_path / "v1.pt2")
    v2 = save_pt2(finetune_statistics(model), tmp_path / "v2.pt2")
    torch.save(model.state_dict(), tmp_path / "model.pt")

    first = cli("register", "cnn", str(v1), "--note", "first", process=True)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "registered cnn@1" in first.stdout and "2/2 normalization layers passed" in first.stdout
    second = data(
        cli("register", "cnn", str(v2), "--json", "--note", "époque 2 ✓", process=True)
    )  # --json writes UTF-8
    assert second["created"] is True and second["version"]["number"] == 2 and second["version"]["note"] == "époque 2 ✓"
    assert (second["version"]["parent"], second["version"]["operation"]) == ("cnn@1", "fine-tuned")
    assert all(c["passed"] for c in second["checks"])
    assert set(second["seconds"]) == {"reading", "gate", "staging", "commit"} and all(
        s > 0 for s in second["seconds"].values()
    )

    refused = cli("register", "cnn", str(tmp_path / "model.pt"))  # as a process: tests/converters/test_pt2_safety.py
    assert refused.returncode == 6 and "pickle" in refused.stderr
    assert [v["number"] for v in data(cli("versions", "cnn", "--json"))["versions"]] == [1, 2]
    entries = data(cli("audit", "--json"))["entries"]
    assert [e["action"] for e in entries] == ["register", "register", "register_failed"]
    assert {e["user"] for e in entries} == {"cli-user"}

    assert data(cli("models", "--json")) == [{"name": "cnn", "latest": 2, "versions": 2}]
    shown = cli("show", "cnn@2")
    assert shown.returncode == 0 and "bn1" in shown.stdout and "bn2" in shown.stdout and "passed" in shown.stdout
    diff = data(cli("diff", "cnn@1", "cnn@2", "--json"))
    assert "weights identical" in diff["headline"]
    assert "weights identical" in cli("diff", "cnn@1", "cnn@2").stdout
    tree = cli("lineage", "cnn@2")
    assert tree.returncode == 0 and "cnn@1" in tree.stdout and "fine-tuned" in tree.stdout
    assert cli("alias", "cnn", "production", "cnn@1").returncode == 0
    moved = data(cli("alias", "cnn", "production", "cnn@2", "--json"))
    assert moved["number"] == 2
    assert data(cli("show", "cnn@production", "--json"))["number"] == 2
    verified = cli("verify", "--no-check")  # re-running the checks is covered in test_registry_service
    assert verified.returncode == 0 and "verify PASSED" in verified.stdout
    chain = cli("audit", "--model", "cnn", "--verify")
    assert chain.returncode == 0 and "hash chain intact" in chain.stdout
    assert data(cli("gc", "--grace", "0", "--json"))["deleted"] == []

    missing = cli("show", "cnn@9")
    assert missing.returncode == 13 and "cnn" in missing.stderr

    from registry.service import Registry

    registry = Registry(db=f"sqlite:///{tmp_path / 'reg.db'}", blobs=str(tmp_path / "blobs"))
    path = blob_path(registry, registry.show("cnn@2").manifest["tensors"]["bn2.running_mean"]["digest"])
    path.chmod(stat.S_IWUSR | stat.S_IRUSR)
    data_bytes = bytearray(path.read_bytes())
    data_bytes[-2] ^= 0x10
    path.write_bytes(bytes(data_bytes))
    tampered = cli("verify", "--no-check", "--json", process=True)
    assert tampered.returncode == 12
    problems = json.loads(tampered.stdout)["problems"]
    assert [(p["number"], p["tensor"]) for p in problems] == [(2, "bn2.running_mean")]
    refused_show = cli("show", "cnn@2")
    assert refused_show.returncode == 12 and "bn2.running_mean" in refused_show.stderr


def test_export_of_a_version_writes_each_layer_for_every_framework(cli, tmp_path):
    import keras
    import onnx

    import converters

    model = trained_cnn()
    assert cli("register", "cnn", str(save_pt2(model, tmp_path / "v1.pt2"))).returncode == 0
    for to, suffix in (("onnx", ".onnx"), ("keras", ".keras"), ("torch", "")):
        out = tmp_path / f"layers_{to}"
        done = data(cli("export-layers", "cnn@1", "--to", to, "-o", str(out), "--json", process=to == "keras"))
        files = sorted(Path(layer["file"]) for layer in done["layers"])
        assert len(files) == 2 and all(
            f.suffix == suffix and (f.is_dir() if to == "torch" else f.is_file()) for f in files
        ), files
    # what was exported computes the registered layers: eps and statistics survive
    first_bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    onnx_spec = converters.to_spec(onnx.load(str(sorted((tmp_path / "layers_onnx").iterdir())[0])))
    keras_layer = keras.saving.load_model(sorted((tmp_path / "layers_keras").iterdir())[0], safe_mode=True).layers[-1]
    assert onnx_spec.eps == first_bn.eps == keras_layer.epsilon
    # torch: a folder per layer, the state dict beside the spec that says how to build the module (eps, momentum, flags)
    torch_folder = sorted((tmp_path / "layers_torch").iterdir())[0]
    torch_spec = load_spec(torch_folder)
    assert (torch_spec.eps, torch_spec.momentum) == (first_bn.eps, first_bn.momentum)
    rebuilt = converters.from_spec(torch_spec, "torch")
    rebuilt.load_state_dict(
        {k: torch.from_numpy(v.copy()) for k, v in load_file(str(torch_folder / "state_dict.safetensors")).items()},
        strict=True,
    )
    assert torch.equal(rebuilt.running_var, first_bn.running_var)
    assert (onnx_spec.tensors["running_var"] == first_bn.running_var.numpy()).all()
    missing = cli("export-layers", "cnn@9", "--to", "onnx", "-o", str(tmp_path / "none"))
    assert missing.returncode == 13 and "cnn@9" in missing.stderr


def test_register_says_which_framework_left_layers_unchecked_and_prints_no_markup(cli, tmp_path):
    """A Keras mixed_float16 BatchNormalization with trained float32 state passes the gate on its Keras leg while torch
    and ONNX cannot express its float32 state: "1/1 passed" alone read as checked everywhere (cli/check_summary.py)."""
    import keras
    import numpy as np

    inputs = keras.Input((4, 4, 3))
    model = keras.Model(inputs, keras.layers.BatchNormalization(dtype="mixed_float16", name="bn_mixed")(inputs))
    layer = model.get_layer("bn_mixed")
    layer.gamma.assign(
        np.array([1.0 + 2.0**-12, 0.5, 2.0], "float32")
    )  # float32 state no float16 holds: a trained layer
    layer.moving_variance.assign(np.array([0.5, 2.0, 3.25], "float32"))
    path = tmp_path / "mixed.keras"
    model.save(path)
    run = cli("register", "mixed", str(path))
    assert run.returncode == 0, run.output[-3000:]
    text = " ".join(run.stdout.split())
    assert "1/1 normalization layers passed" in text
    for framework in ("torch", "onnx"):
        assert f"not checked in {framework}: 1 of 1 layers (not expressible: layer 'bn_mixed', setting '" in text, text
    assert "not checked in keras" not in text and "[yellow]" not in text and "[/]" not in text


def test_a_model_made_from_scratch_records_no_parent_and_a_dropped_note_is_said(cli, tmp_path):
    """`--no-parent` (or `--operation registered`) records a retrained model without the latest version as its parent,
    and a note given with content the registry already holds is said not to be stored (issue 35)."""
    model = trained_cnn()
    v1 = save_pt2(model, tmp_path / "v1.pt2")
    other = trained_cnn()
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(0.01)  # other weights and norm scales: a model trained again
    retrained = save_pt2(other, tmp_path / "retrained.pt2")
    first = cli("register", "cnn", str(v1), "--note", "first")
    assert first.returncode == 0, first.stderr
    again = cli("register", "cnn", str(v1), "--note", "second try")
    assert again.returncode == 0 and "unchanged" in again.stdout
    assert "the note was not stored: cnn@1 keeps its own ('first')" in again.stdout
    assert data(cli("register", "cnn", str(v1), "--note", "x", "--json"))["note_stored"] is False
    scratch = data(cli("register", "cnn", str(retrained), "--no-parent", "--json"))
    assert (
        scratch["created"] and scratch["version"]["parent"] is None and scratch["version"]["operation"] == "registered"
    )
    conflict = cli("register", "cnn", str(retrained), "--no-parent", "--parent", "cnn@1")
    assert conflict.returncode == 2 and "--no-parent" in conflict.stderr + conflict.stdout
