"""`normbridge mlflow push|import` against a real MLflow tracking server (HTTP, SQLite, proxied artifacts).

Push: the MLflow model version exists, its normbridge.* tags match the normbridge registry, and its
attached bundle downloads and loads to the same manifest digest. Import: ONNX, Keras and pt2
models logged with MLflow's own log_model come in through the gate with their exact state; a
pickled PyTorch model is refused (and never unpickled) unless --trust-pickle is given.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from registry.service import Registry
from tests.mlflow_server import mlflow_server  # noqa: F401  (module-scoped fixture)
from tests.registry.test_registry_service import finetune_statistics, trained_cnn


@pytest.fixture(autouse=True)
def no_implicit_mlflow_store(tmp_path, monkeypatch):
    """Run in an empty folder and prove afterwards that nothing fell back to MLflow's ./mlruns or ./mlflow.db."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield
    assert sorted(p.name for p in cwd.iterdir()) == []


@pytest.fixture
def store(tmp_path) -> dict:
    return {"db": f"sqlite:///{tmp_path / 'registry.db'}", "blobs": str(tmp_path / "blobs")}


def point_mlflow_at(url: str, monkeypatch):
    """MLflow's fluent API (log_model, models:/ downloads) pointed at the test server, never at ./mlruns."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    mlflow.set_tracking_uri(url)
    mlflow.set_registry_uri(url)
    return mlflow


@pytest.fixture
def mlflow_fluent(mlflow_server, monkeypatch):  # noqa: F811
    mlflow = point_mlflow_at(mlflow_server.url, monkeypatch)
    yield mlflow
    if mlflow.active_run():
        mlflow.end_run()


def run(cli_app, *args: str):
    return CliRunner().invoke(cli_app, list(args))


def bn_eval(x: np.ndarray, spec, axis: int) -> np.ndarray:
    """Inference BatchNorm in NumPy from a spec's tensors, channels on `axis`."""
    shape = [1] * x.ndim
    shape[axis] = -1
    t = {k: np.asarray(v, np.float64).reshape(shape) for k, v in spec.tensors.items() if k != "num_batches_tracked"}
    return (x - t["running_mean"]) / np.sqrt(t["running_var"] + spec.eps) * t["scale"] + t["bias"]


# ---------------------------------------------------------------------------------------- push


@pytest.mark.slow
def test_push_registers_versions_with_normbridge_tags_and_a_bundle_that_loads_to_the_same_digest(
    cli_app,
    mlflow_server,
    store,
    tmp_path,  # noqa: F811
    monkeypatch,
):
    from mlflow.tracking import MlflowClient

    from registry.manifest_io import load_artifact_folder

    registry = Registry(db=store["db"], blobs=store["blobs"], user="tester")
    model = trained_cnn()
    first = registry.register("cnn-push", model).version  # while the MLflow server boots
    second = registry.register("cnn-push", finetune_statistics(model)).version
    mlflow_fluent = point_mlflow_at(mlflow_server.url, monkeypatch)
    options = ["--tracking-uri", mlflow_server.url, "--db", store["db"], "--blobs", store["blobs"], "--json"]

    pushed = run(cli_app, "mlflow", "push", "cnn-push@1", *options)
    assert pushed.exit_code == 0, pushed.output
    result = json.loads(pushed.stdout)
    client = MlflowClient(tracking_uri=mlflow_server.url, registry_uri=mlflow_server.url)
    version = client.get_model_version("cnn-push", result["version"])
    assert version.tags["normbridge.digest"] == first.digest
    assert version.tags["normbridge.content_digest"] == first.content_digest
    assert version.tags["normbridge.version"] == "cnn-push@1"
    assert version.tags["normbridge.parent"] == "" and version.tags["normbridge.operation"] == "registered"
    assert version.tags["normbridge.equivalence"] == "passed 2/2"
    assert version.tags["normbridge.normalizers"] == "2 (batch x2)"

    downloaded = mlflow_fluent.artifacts.download_artifacts(
        f"models:/cnn-push/{version.version}", dst_path=str(tmp_path / "dl1")
    )
    assert load_artifact_folder(downloaded).manifest.digest() == first.digest

    child = run(cli_app, "mlflow", "push", "cnn-push@2", *options)
    assert child.exit_code == 0, child.output
    child_version = client.get_model_version("cnn-push", json.loads(child.stdout)["version"])
    assert child_version.version != version.version
    assert child_version.tags["normbridge.digest"] == second.digest
    assert (
        child_version.tags["normbridge.parent"] == "cnn-push@1"
        and child_version.tags["normbridge.operation"] == "fine-tuned"
    )
    child_folder = client.download_artifacts(child_version.run_id, "normbridge-artifact", str(tmp_path / "dl2"))
    assert load_artifact_folder(child_folder).manifest.digest() == second.digest

    elsewhere = {"db": f"sqlite:///{tmp_path / 'other.db'}", "blobs": str(tmp_path / "other-blobs")}
    back = run(
        cli_app,
        "mlflow",
        "import",
        f"models:/cnn-push/{version.version}",
        "--db",
        elsewhere["db"],
        "--blobs",
        elsewhere["blobs"],
        "--json",
    )
    assert back.exit_code == 0, back.output
    assert json.loads(back.stdout)["flavor"] == "normbridge-bundle"
    imported = Registry(**elsewhere).show("cnn-push@1")
    assert imported.content_digest == first.content_digest and imported.operation == "imported"

    again = run(cli_app, "mlflow", "push", "cnn-push@1", *options)
    assert again.exit_code == 0 and json.loads(again.stdout) | {"created": True} == result | {"created": True}
    assert json.loads(again.stdout)["created"] is False
    assert len(client.search_model_versions("name = 'cnn-push'")) == 2


def test_push_without_a_tracking_uri_is_refused_and_never_writes_mlruns(cli_app, store, monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    Registry(db=store["db"], blobs=store["blobs"]).register("cnn-local", trained_cnn())
    done = run(cli_app, "mlflow", "push", "cnn-local@1", "--db", store["db"], "--blobs", store["blobs"])
    assert done.exit_code == 14 and "--tracking-uri" in done.output


def test_an_unreachable_tracking_server_fails_fast_with_exit_18(cli_app, store):
    from tests.http_server import free_port

    Registry(db=store["db"], blobs=store["blobs"]).register("cnn-away", trained_cnn())
    done = run(
        cli_app,
        "mlflow",
        "push",
        "cnn-away",
        "--tracking-uri",
        f"http://127.0.0.1:{free_port()}",
        "--db",
        store["db"],
        "--blobs",
        store["blobs"],
    )
    assert done.exit_code == 18 and "did not answer" in done.output
    done = run(
        cli_app,
        "mlflow",
        "import",
        "models:/cnn-away/1",
        "--tracking-uri",
        f"http://127.0.0.1:{free_port()}",
        "--db",
        store["db"],
    )
    assert done.exit_code == 18


# -------------------------------------------------------------------------------------- import


@pytest.mark.slow
def test_import_of_an_mlflow_onnx_model_registers_its_exact_batchnorm_through_the_gate(
    cli_app, mlflow_fluent, mlflow_server, store
):  # noqa: F811
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    c = 4
    arrays = {
        "s": rng.normal(1, 0.2, c),
        "b": rng.normal(0, 0.5, c),
        "m": rng.normal(0, 1, c),
        "v": rng.uniform(0.5, 2, c),
    }
    node = helper.make_node("BatchNormalization", ["X", "s", "b", "m", "v"], ["Y"], epsilon=1e-3, name="bn")
    shape = ["N", c, 5, 5]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)],
        initializer=[numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    proto.ir_version = 8
    with mlflow_fluent.start_run():
        mlflow_fluent.onnx.log_model(proto, name="model", registered_model_name="onnx-bn")

    done = run(
        cli_app, "mlflow", "import", "models:/onnx-bn/1", "--db", store["db"], "--blobs", store["blobs"], "--json"
    )
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["flavor"] == "onnx"
    registry = Registry(db=store["db"], blobs=store["blobs"])
    record = registry.show("onnx-bn@1")
    assert record.operation == "imported" and "models:/onnx-bn/1" in record.note
    (spec,) = registry.specs("onnx-bn@1")
    for name, key in (("scale", "s"), ("bias", "b"), ("running_mean", "m"), ("running_var", "v")):
        np.testing.assert_array_equal(spec.tensors[name], arrays[key].astype(np.float32))
    x = rng.normal(size=(2, c, 5, 5)).astype(np.float32)
    original = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"X": x}
    )[0]
    np.testing.assert_allclose(bn_eval(x.astype(np.float64), spec, axis=1), original, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_import_of_an_mlflow_keras_model_registers_its_exact_batchnorm(cli_app, mlflow_fluent, store):
    import keras

    rng = np.random.default_rng(1)
    inputs = keras.Input((6,))
    bn = keras.layers.BatchNormalization(epsilon=1e-2, name="bn")
    model = keras.Model(inputs, bn(inputs))
    weights = [rng.normal(1, 0.2, 6), rng.normal(0, 0.5, 6), rng.normal(0, 1, 6), rng.uniform(0.5, 2, 6)]
    bn.set_weights([w.astype(np.float32) for w in weights])
    with mlflow_fluent.start_run():
        info = mlflow_fluent.keras.log_model(model, name="model")

    done = run(
        cli_app,
        "mlflow",
        "import",
        info.model_uri,
        "--name",
        "keras-bn",
        "--db",
        store["db"],
        "--blobs",
        store["blobs"],
    )
    assert done.exit_code == 0, done.output
    assert "keras" in done.stdout
    registry = Registry(db=store["db"], blobs=store["blobs"])
    assert registry.show("keras-bn@1").operation == "imported"
    (spec,) = registry.specs("keras-bn@1")
    for name, array in zip(("scale", "bias", "running_mean", "running_var"), weights):
        np.testing.assert_array_equal(spec.tensors[name], array.astype(np.float32))
    x = rng.normal(size=(3, 6)).astype(np.float32)
    original = np.asarray(model(x, training=False))
    np.testing.assert_allclose(bn_eval(x.astype(np.float64), spec, axis=-1), original, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_import_of_an_mlflow_pt2_pytorch_model_needs_no_pickle(cli_app, mlflow_fluent, store):
    model = trained_cnn(seed=3)
    with mlflow_fluent.start_run():
        info = mlflow_fluent.pytorch.log_model(
            model,
            name="model",
            input_example=np.random.default_rng(0).normal(size=(2, 3, 8, 8)).astype(np.float32),
            serialization_format="pt2",
        )

    done = run(
        cli_app,
        "mlflow",
        "import",
        info.model_uri,
        "--name",
        "pt2-cnn",
        "--db",
        store["db"],
        "--blobs",
        store["blobs"],
        "--json",
    )
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["flavor"] == "pytorch-pt2"
    specs = {spec.name: spec for spec in Registry(db=store["db"], blobs=store["blobs"]).specs("pt2-cnn@1")}
    assert len(specs) == 2
    for spec in specs.values():
        layer = model.bn1 if spec.tensors["running_mean"].shape == (4,) else model.bn2
        np.testing.assert_array_equal(spec.tensors["running_var"], layer.running_var.numpy())
        np.testing.assert_array_equal(spec.tensors["scale"], layer.weight.detach().numpy())


class MarkingBatchNorm(torch.nn.Module):
    """A BatchNorm model whose unpickling leaves a marker file: proof of whether the pickle ran."""

    def __init__(self, marker: Path):
        super().__init__()
        self.marker = str(marker)
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(x)

    def __setstate__(self, state):
        Path(state["marker"]).write_text("unpickled")
        super().__setstate__(state)


@pytest.mark.slow
def test_a_pickled_pytorch_model_is_refused_unpickled_unless_trusted_then_registered_with_a_warning(
    cli_app, mlflow_fluent, store, tmp_path
):
    marker = tmp_path / "unpickled.txt"
    model = MarkingBatchNorm(marker).eval()
    with torch.no_grad():
        model.bn.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0]))
        model.bn.running_var.copy_(torch.tensor([1.5, 0.25, 3.0]))
        model.bn.weight.copy_(torch.tensor([1.1, 0.9, -0.7]))
    with mlflow_fluent.start_run():
        info = mlflow_fluent.pytorch.log_model(model, name="model", serialization_format="pickle")
    marker.unlink(missing_ok=True)  # MLflow's own logging round-trips the object; only what import does counts
    options = ["--name", "pickled-bn", "--db", store["db"], "--blobs", store["blobs"]]

    refused = run(cli_app, "mlflow", "import", info.model_uri, *options)
    assert refused.exit_code == 6, refused.output
    assert "--trust-pickle" in refused.stderr and "trust" in refused.stderr
    assert not marker.exists(), "the pickle was loaded although --trust-pickle was not given"
    assert Registry(db=store["db"], blobs=store["blobs"]).models() == []

    trusted = run(cli_app, "mlflow", "import", info.model_uri, *options, "--trust-pickle")
    assert trusted.exit_code == 0, trusted.output
    assert "warning" in trusted.stderr and "trust" in trusted.stderr
    assert marker.exists()
    registry = Registry(db=store["db"], blobs=store["blobs"])
    record = registry.show("pickled-bn@1")
    assert record.operation == "imported" and info.model_uri in record.note
    (spec,) = registry.specs("pickled-bn@1")
    np.testing.assert_array_equal(spec.tensors["running_mean"], np.array([0.5, -1.0, 2.0], np.float32))
    np.testing.assert_array_equal(spec.tensors["scale"], np.array([1.1, 0.9, -0.7], np.float32))


@pytest.mark.slow
def test_push_through_a_registry_server_logs_the_same_bundle(cli_app, mlflow_server, store, tmp_path, monkeypatch):  # noqa: F811
    """`--server URL mlflow push` failed: 'RemoteRegistry' object has no attribute 'blob_reader' (exit 1),
    after creating a run."""
    from mlflow.tracking import MlflowClient

    from registry.manifest_io import load_artifact_folder
    from tests.http_server import create_token, running_server

    registry = Registry(db=store["db"], blobs=store["blobs"], user="tester")
    record = registry.register("cnn-remote", trained_cnn()).version
    token = create_token(store["db"], "pusher", "read", models=["cnn-remote"])
    point_mlflow_at(mlflow_server.url, monkeypatch)
    with running_server(db=store["db"], blobs=store["blobs"], log=tmp_path / "serve.log") as server:
        pushed = run(
            cli_app,
            "--server",
            server.url,
            "--token",
            token,
            "mlflow",
            "push",
            "cnn-remote@1",
            "--tracking-uri",
            mlflow_server.url,
            "--json",
        )
    assert pushed.exit_code == 0, pushed.output
    client = MlflowClient(tracking_uri=mlflow_server.url, registry_uri=mlflow_server.url)
    version = client.get_model_version("cnn-remote", json.loads(pushed.stdout)["version"])
    assert version.tags["normbridge.digest"] == record.digest
    folder = client.download_artifacts(version.run_id, "normbridge-artifact", str(tmp_path / "dl"))
    assert load_artifact_folder(folder).manifest.digest() == record.digest
