"""`normbridge mlflow import` prints no MLflow progress bars (issue 35 §3): a real process against a real MLflow server.

MLflow draws tqdm bars ("Downloading artifacts: 100%|...") on every artifact download; the CLI turns them off
(cli/framework_noise.py) unless `--verbose`, as it does TensorFlow's start-up lines.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cli_run import run_cli
from tests.mlflow_server import mlflow_server  # noqa: F401  (module-scoped fixture)

pytestmark = pytest.mark.slow


def _onnx_batchnorm():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    arrays = {
        "s": rng.normal(1, 0.2, 4),
        "b": rng.normal(0, 0.5, 4),
        "m": rng.normal(0, 1, 4),
        "v": rng.uniform(0.5, 2, 4),
    }
    node = helper.make_node("BatchNormalization", ["X", "s", "b", "m", "v"], ["Y"], epsilon=1e-3, name="bn")
    shape = ["N", 4, 5, 5]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)],
        initializer=[numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    proto.ir_version = 8
    return proto


def test_mlflow_import_prints_no_progress_bars(mlflow_server, tmp_path, monkeypatch):  # noqa: F811
    import mlflow

    from cli.framework_noise import MLFLOW_PROGRESS_ENV

    # an in-process CLI run earlier in the session set it in os.environ, which run_cli's children inherit
    monkeypatch.delenv(MLFLOW_PROGRESS_ENV, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    mlflow.set_tracking_uri(mlflow_server.url)
    mlflow.set_registry_uri(mlflow_server.url)
    with mlflow.start_run():
        mlflow.onnx.log_model(_onnx_batchnorm(), name="model", registered_model_name="onnx-quiet")
    options = [
        "--tracking-uri",
        mlflow_server.url,
        "--db",
        f"sqlite:///{tmp_path / 'registry.db'}",
        "--blobs",
        str(tmp_path / "blobs"),
    ]
    work = tmp_path / "cwd"
    work.mkdir()
    done = run_cli(
        "mlflow", "import", "models:/onnx-quiet/1", *options, cwd=work, env={"MLFLOW_TRACKING_URI": mlflow_server.url}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported onnx-quiet@1" in done.stdout
    for bar in ("Downloading artifacts", "%|", "it/s]"):
        assert bar not in done.stdout + done.stderr, done.stderr
    loud = run_cli(
        "--verbose",
        "mlflow",
        "import",
        "models:/onnx-quiet/1",
        "--name",
        "onnx-loud",
        *options,
        cwd=work,
        env={"MLFLOW_TRACKING_URI": mlflow_server.url},
    )
    assert loud.returncode == 0 and "Downloading artifacts" in loud.stderr  # the bars are MLflow's, back with --verbose
