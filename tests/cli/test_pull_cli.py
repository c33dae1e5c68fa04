"""`normbridge pull` and `normbridge export NAME@REF`: a version back from the registry alone, locally and with --server.

Commands run in-process through Typer's CliRunner against a real SQLite registry (and, for --server, a real
`normbridge serve`); the source file is deleted before anything is pulled or exported.
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from typer.testing import CliRunner

from registry.service import Registry
from tests.http_server import create_token, running_server
from tests.registry.test_pull import SAMPLE, trained_cnn


@pytest.fixture
def local(tmp_path):
    db, blobs = f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path / "blobs")
    model = trained_cnn()
    source = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(model, (torch.from_numpy(SAMPLE),)), str(source))
    Registry(db=db, blobs=blobs, user="test").register("cnn", source)
    source.unlink()
    return {"db": db, "blobs": blobs, "model": model, "args": ["--db", db, "--blobs", blobs]}


def invoke(cli_app, *args: str):
    return CliRunner().invoke(cli_app, list(args), catch_exceptions=False)


def test_pull_writes_the_runnable_pt2_and_says_where(cli_app, local, tmp_path):
    done = invoke(cli_app, "pull", "cnn@1", "-o", str(tmp_path / "back.pt2"), *local["args"], "--json")
    assert done.exit_code == 0, done.output
    result = json.loads(done.output)
    assert result["format"] == "pt2" and result["path"] == str(tmp_path / "back.pt2")
    with torch.no_grad():
        got = torch.export.load(result["path"]).module()(torch.from_numpy(SAMPLE)).numpy()
        assert np.array_equal(got, local["model"](torch.from_numpy(SAMPLE)).numpy())


def test_pull_refuses_a_format_the_version_is_not_and_names_the_way(cli_app, local, tmp_path):
    done = invoke(cli_app, "pull", "cnn@1", "-o", str(tmp_path / "x.onnx"), "--format", "onnx", *local["args"])
    assert done.exit_code == 14 and "normbridge export cnn@1 --to onnx" in done.output
    assert not (tmp_path / "x.onnx").exists()


def test_export_for_serving_from_a_registry_whose_source_file_was_deleted(cli_app, local, tmp_path):
    out = tmp_path / "served.onnx"
    done = invoke(cli_app, "export", "cnn@1", "--to", "onnx", "-o", str(out), *local["args"], "--json")
    assert done.exit_code == 0, done.output
    result = json.loads(done.output)
    assert result["written"] and result["contract"]["passed"]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    served = session.run(None, {session.get_inputs()[0].name: SAMPLE})[0]
    with torch.no_grad():
        expected = local["model"](torch.from_numpy(SAMPLE)).numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_pull_and_export_with_server_and_a_scoped_token(cli_app, local, tmp_path):
    Registry(db=local["db"], blobs=local["blobs"], user="test").register("other", trained_cnn(seed=2))
    token = create_token(local["db"], "cnn-team", "read", models=["cnn"])
    with running_server(db=local["db"], blobs=local["blobs"], log=tmp_path / "serve.log") as server:
        remote = ["--server", server.url, "--token", token]
        done = invoke(cli_app, *remote, "pull", "cnn@1", "-o", str(tmp_path / "remote.pt2"))
        assert done.exit_code == 0, done.output
        done = invoke(cli_app, *remote, "export", "cnn@1", "--to", "onnx", "-o", str(tmp_path / "remote.onnx"), "--json")
        assert done.exit_code == 0 and json.loads(done.output)["written"], done.output
        refused = invoke(cli_app, *remote, "pull", "other", "-o", str(tmp_path / "other.safetensors"), "--format", "safetensors")
        assert refused.exit_code != 0 and "forbidden" in refused.output
    with torch.no_grad():
        got = torch.export.load(str(tmp_path / "remote.pt2")).module()(torch.from_numpy(SAMPLE)).numpy()
        assert np.array_equal(got, local["model"](torch.from_numpy(SAMPLE)).numpy())
    assert not (tmp_path / "other.safetensors").exists()
