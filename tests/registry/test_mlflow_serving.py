"""MLflow can serve what `normbridge mlflow push` sends (issue 35, item 2), tested with MLflow's own processes.

A real `mlflow server` (tests/mlflow_server.py) receives a plain CNN `.pt2` and a transformers ResNet `.pt2` (a tiny
config, random state, called with `pixel_values=`). Then, each in its own process as a user would run it:
`mlflow.pyfunc.load_model` in a fresh interpreter that never imported transformers, `mlflow models predict
--env-manager local` on a JSON file of plain numbers, and `mlflow models serve` on loopback answering POST /invocations.
Expected outputs are the original nn.Module's. The pushed model has a signature and an input example in the model's
dtypes, requirements pinned to public versions (no '+cpu'), its weights once (no bundle blobs beside the model file),
and no artifact lands in the working directory: beside a local tracking database, and an experiment pointing into the
working directory is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from registry.mlflow_bridge import import_model, push
from registry.service import Registry
from testkit.processes import free_port, stop_process_group, wait_for_http
from tests.mlflow_server import SCRIPT, mlflow_server  # noqa: F401  (module-scoped fixture)
from tests.real_norms import randomise
from tests.registry.test_pull import SAMPLE, trained_cnn

pytestmark = pytest.mark.slow  # an MLflow server, and MLflow's own processes

BATCH = torch.export.Dim("batch", min=1, max=1024)
PIXELS = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)


@pytest.fixture(autouse=True)
def empty_working_directory(tmp_path, monkeypatch):
    """Run in an empty folder and prove afterwards that no artifact fell into it (MLflow's ./mlruns, ./mlartifacts)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield cwd
    assert sorted(p.name for p in cwd.iterdir()) == []


@pytest.fixture
def registry(tmp_path):
    registry = Registry(db=f"sqlite:///{tmp_path / 'r.db'}", blobs=str(tmp_path / "blobs"), user="test")
    yield registry
    registry.meta.close()


def resnet() -> torch.nn.Module:
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    return randomise(ResNetModel(config), seed=1)


def pushed_resnet(registry, server, folder: Path) -> tuple[str, dict[str, np.ndarray]]:
    """A transformers ResNet exported by keyword with an open batch, registered and pushed:
    (models:/ URI, its outputs on PIXELS)."""
    model = resnet()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(
            model, (), {"pixel_values": torch.from_numpy(PIXELS)}, dynamic_shapes={"pixel_values": {0: BATCH}}
        )
    torch.export.save(program, str(folder / "resnet.pt2"))
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(PIXELS))
    registry.register("resnet", folder / "resnet.pt2")
    result = push(registry, "resnet@1", server.url)
    expected = {"last_hidden_state": out.last_hidden_state.numpy(), "pooler_output": out.pooler_output.numpy()}
    return f"models:/resnet/{result.version}", expected


def pushed_cnn(registry, server, folder: Path) -> tuple[str, np.ndarray]:
    model = trained_cnn(seed=7).eval()
    torch.export.save(torch.export.export(model, (torch.from_numpy(SAMPLE),)), str(folder / "cnn.pt2"))
    with torch.no_grad():
        expected = model(torch.from_numpy(SAMPLE)).numpy()
    registry.register("cnn", folder / "cnn.pt2")
    return f"models:/cnn/{push(registry, 'cnn@1', server.url).version}", expected


def mlflow_env(server) -> dict[str, str]:
    """A user's shell with this virtualenv active (`mlflow models serve` runs its `uvicorn` from PATH)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {
        **os.environ,
        "PATH": path,
        "MLFLOW_TRACKING_URI": server.url,
        "MLFLOW_REGISTRY_URI": server.url,
        "PYTHONPATH": "",
    }


def downloaded(server, uri: str, folder: Path) -> Path:
    """The pushed folder of models:/NAME/N, resolved on the server's registry
    (MLflow resolves models:/ on its global one)."""
    import mlflow.artifacts
    from mlflow.tracking import MlflowClient

    name, version = uri[len("models:/") :].split("/")
    location = MlflowClient(tracking_uri=server.url, registry_uri=server.url).get_model_version_download_uri(
        name, version
    )
    return Path(
        mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=str(folder), tracking_uri=server.url)
    )


FRESH_INTERPRETER = """
import sys, numpy as np, mlflow.pyfunc
assert "transformers" not in sys.modules
model = mlflow.pyfunc.load_model(sys.argv[1])
outputs = model.predict({"pixel_values": np.load(sys.argv[2])})
np.savez(sys.argv[3], **outputs)
"""


def test_a_transformers_resnet_pt2_loads_in_a_fresh_interpreter_and_predicts_by_keyword(
    mlflow_server, registry, tmp_path
):  # noqa: F811
    uri, expected = pushed_resnet(registry, mlflow_server, tmp_path)
    np.save(tmp_path / "pixels.npy", PIXELS)
    done = subprocess.run(
        [sys.executable, "-c", FRESH_INTERPRETER, uri, str(tmp_path / "pixels.npy"), str(tmp_path / "out.npz")],
        env=mlflow_env(mlflow_server),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as got:
        assert sorted(got.files) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)

    import mlflow.models

    folder = downloaded(mlflow_server, uri, tmp_path / "dl")
    mlmodel = (folder / "MLmodel").read_text()
    signature = mlflow.models.Model.load(str(folder / "MLmodel")).signature
    (spec,) = signature.inputs.inputs
    assert (spec.name, spec.type, spec.shape) == ("pixel_values", np.dtype("float32"), (-1, 3, 32, 32))
    example = json.loads((folder / "serving_input_example.json").read_text())
    assert np.asarray(example["inputs"]["pixel_values"]).shape == (1, 3, 32, 32)
    assert "normbridge_pt2_pyfunc" in mlmodel
    requirements = (folder / "requirements.txt").read_text().split()
    assert_installable(requirements)
    assert any(line.startswith("transformers==") for line in requirements)


def assert_installable(requirements: list[str]) -> None:
    """Each requirement pins a public version (PyPI holds no '+cpu'), the one installed here."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.version import Version

    assert requirements
    for line in requirements:
        requirement = Requirement(line)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==" and Version(specifier.version).local is None, line
        assert Version(importlib.metadata.version(requirement.name)).public == specifier.version, line


def test_a_plain_cnn_pt2_predicts_through_mlflow_models_predict_from_plain_json_numbers(
    cli_app,
    mlflow_server,
    registry,  # noqa: F811
    tmp_path,
):
    from typer.testing import CliRunner

    uri, expected = pushed_cnn(registry, mlflow_server, tmp_path)
    store = ["--db", registry.db_url, "--blobs", registry.blob_uri, "--tracking-uri", mlflow_server.url]
    again = CliRunner().invoke(cli_app, ["mlflow", "push", "cnn@1", *store])
    assert again.exit_code == 0, again.output
    assert f"serve       mlflow models serve -m {uri}" in again.output
    assert (
        json.loads(CliRunner().invoke(cli_app, ["mlflow", "push", "cnn@1", *store, "--json"]).stdout)["mlflow_model"]
        is True
    )
    # JSON numbers are doubles; nn.Sequential.forward names its argument `input`, the program keeps the name
    (tmp_path / "inp.json").write_text(json.dumps({"inputs": {"input": SAMPLE.astype(np.float64).tolist()}}))
    command = [
        str(SCRIPT),
        "models",
        "predict",
        "-m",
        uri,
        "-i",
        str(tmp_path / "inp.json"),
        "-o",
        str(tmp_path / "out.json"),
        "--content-type",
        "json",
        "--env-manager",
        "local",
    ]
    done = subprocess.run(
        command, env=mlflow_env(mlflow_server), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    predictions = json.loads((tmp_path / "out.json").read_text())["predictions"]
    np.testing.assert_allclose(np.asarray(predictions, np.float32), expected, rtol=1e-5, atol=1e-5)

    folder = downloaded(mlflow_server, uri, tmp_path / "dl")
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == [
        "code",
        "data",
    ]  # no blobs/: the weights are in data/model.pt2 only
    assert [p.name for p in folder.rglob("*.pt2")] == ["model.pt2"]
    assert_installable((folder / "requirements.txt").read_text().split())

    other = Registry(db=f"sqlite:///{tmp_path / 'other.db'}", blobs=str(tmp_path / "other-blobs"), user="test")
    back = import_model(other, uri, mlflow_server.url)
    assert back.flavor == "normbridge-bundle"
    assert other.show("cnn@1").content_digest == registry.show("cnn@1").content_digest
    other.meta.close()


def test_mlflow_models_serve_answers_on_loopback_for_the_resnet(mlflow_server, registry, tmp_path):  # noqa: F811
    uri, expected = pushed_resnet(registry, mlflow_server, tmp_path)
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                str(SCRIPT),
                "models",
                "serve",
                "-m",
                uri,
                "--env-manager",
                "local",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            env=mlflow_env(mlflow_server),
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_http(
            f"http://127.0.0.1:{port}/ping",
            process,
            180,
            lambda: log.read_text(errors="replace"),
            "mlflow models serve",
        )
        body = json.dumps({"inputs": {"pixel_values": PIXELS.astype(np.float64).tolist()}}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            predictions = json.loads(response.read())["predictions"]
    finally:
        stop_process_group(process, grace=5)
    for name, value in expected.items():
        np.testing.assert_allclose(np.asarray(predictions[name], np.float32), value, rtol=1e-5, atol=1e-5)


def test_a_push_to_a_local_tracking_database_keeps_artifacts_beside_it_not_in_the_working_directory(registry, tmp_path):
    from mlflow.tracking import MlflowClient

    model = trained_cnn(seed=2).eval()
    torch.export.save(torch.export.export(model, (torch.from_numpy(SAMPLE),)), str(tmp_path / "cnn.pt2"))
    registry.register("cnn-local", tmp_path / "cnn.pt2")
    tracking = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    (tmp_path / "mlflow").mkdir()
    result = push(registry, "cnn-local@1", tracking)
    run = MlflowClient(tracking_uri=tracking).get_run(result.run_id)
    assert run.info.artifact_uri.startswith((tmp_path / "mlflow" / "mlartifacts").as_uri())
    assert (tmp_path / "mlflow" / "mlartifacts").is_dir()


def test_an_experiment_keeping_artifacts_in_the_working_directory_is_refused_before_anything_is_written(
    registry, tmp_path, empty_working_directory
):
    """An experiment made earlier with MLflow's default ./mlruns, where the push runs: refused, nothing lands there."""
    from mlflow.tracking import MlflowClient

    from schemas.errors import RegistryError

    model = trained_cnn(seed=3).eval()
    torch.export.save(torch.export.export(model, (torch.from_numpy(SAMPLE),)), str(tmp_path / "cnn.pt2"))
    registry.register("cnn-here", tmp_path / "cnn.pt2")
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=tracking)
    client.create_experiment("normbridge", artifact_location=(empty_working_directory / "mlruns").as_uri())
    with pytest.raises(RegistryError, match="inside the folder this command runs from"):
        push(registry, "cnn-here@1", tracking)
    (run,) = client.search_runs([client.get_experiment_by_name("normbridge").experiment_id])
    assert run.info.status == "FAILED"
