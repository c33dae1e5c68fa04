"""`normbridge mlflow push` attaches the runnable model: MLflow loads it, and `mlflow import` keeps its structure.

A real `mlflow server` (tests/mlflow_server.py); outputs compared with NumPy against the original model's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from registry.mlflow_bridge import import_model, push
from registry.service import Registry
from tests.mlflow_server import mlflow_server  # noqa: F401  (module-scoped fixture)
from tests.registry.test_pull import SAMPLE, onnx_run, trained_cnn

pytestmark = pytest.mark.slow  # an MLflow server


@pytest.fixture
def registry(tmp_path):
    return Registry(db=f"sqlite:///{tmp_path / 'r.db'}", blobs=str(tmp_path / "blobs"), user="test")


def test_a_pushed_onnx_version_loads_in_mlflow_and_imports_back_byte_identical(
    mlflow_server, registry, tmp_path, monkeypatch
):  # noqa: F811
    import mlflow

    monkeypatch.chdir(tmp_path)
    source = tmp_path / "cnn.onnx"
    torch.onnx.export(
        trained_cnn(),
        (torch.from_numpy(SAMPLE),),
        str(source),
        dynamo=False,
        do_constant_folding=False,
        training=torch.onnx.TrainingMode.EVAL,
    )
    registry.register("cnn-onnx", source)
    result = push(registry, "cnn-onnx@1", mlflow_server.url)
    mlflow.set_tracking_uri(mlflow_server.url)
    mlflow.set_registry_uri(mlflow_server.url)
    loaded = mlflow.onnx.load_model(f"models:/cnn-onnx/{result.version}")
    assert loaded.SerializeToString() == source.read_bytes()
    served = mlflow.pyfunc.load_model(f"models:/cnn-onnx/{result.version}")  # what `mlflow models serve` runs
    outputs = served.predict({loaded.graph.input[0].name: SAMPLE})
    assert np.array_equal(next(iter(outputs.values())), onnx_run(source))

    other = Registry(db=f"sqlite:///{tmp_path / 'other.db'}", blobs=str(tmp_path / "other-blobs"), user="test")
    imported = import_model(other, f"models:/cnn-onnx/{result.version}", mlflow_server.url)
    assert imported.flavor == "normbridge-bundle"
    other.pull("cnn-onnx@1", tmp_path / "back.onnx")
    assert (tmp_path / "back.onnx").read_bytes() == source.read_bytes()
    assert np.array_equal(onnx_run(tmp_path / "back.onnx"), onnx_run(source))


def test_a_pushed_pt2_version_loads_with_mlflow_pytorch(mlflow_server, registry, tmp_path, monkeypatch):  # noqa: F811
    import mlflow

    monkeypatch.chdir(tmp_path)
    model = trained_cnn(seed=5)
    source = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(model, (torch.from_numpy(SAMPLE),)), str(source))
    registry.register("cnn-pt2", source)
    result = push(registry, "cnn-pt2@1", mlflow_server.url)
    mlflow.set_tracking_uri(mlflow_server.url)
    mlflow.set_registry_uri(mlflow_server.url)
    loaded = mlflow.pytorch.load_model(f"models:/cnn-pt2/{result.version}")
    with torch.no_grad():
        assert np.array_equal(loaded(torch.from_numpy(SAMPLE)).numpy(), model(torch.from_numpy(SAMPLE)).numpy())
