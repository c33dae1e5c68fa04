"""The runnable MLflow model `normbridge mlflow push` writes beside a version's bundle, so MLflow can load and serve it.

The pushed folder is both: the normbridge artifact (manifest.json + blobs/, which `mlflow import` reads back with its
structure) and an MLflow model (MLmodel and the model file), so `mlflow.pyfunc.load_model("models:/NAME/N")`,
`mlflow models download` and `mlflow models serve` work on it. The model file is the version as `normbridge pull`
gives it back (registry/service/model_files.py): ONNX through the onnx flavour (the registered bytes), Keras through
the keras flavour (a .keras file, loaded by MLflow with Keras' own loader), a .pt2 through the pytorch flavour with
serialization_format pt2 (its sample inputs record is empty, so MLflow's pickle-free check passes). Requirements are
given, never inferred (inferring runs the model in a subprocess). A torch nn.Module version has no structure: its
folder stays a bundle only.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

MLMODEL = "MLmodel"


def write_mlflow_model(registry, ref: str, folder: Path) -> str | None:
    """Add the MLflow model of version `ref` into `folder` (a saved bundle); the flavour written, or None when there is none."""
    manifest = registry.manifest(ref)
    if manifest.structure is None:
        return None
    fmt = manifest.structure.format
    file = registry.model_file(ref)
    with tempfile.TemporaryDirectory(prefix="normbridge-mlmodel-") as tmp:
        target = Path(tmp) / "model"
        if fmt == "onnx":
            _onnx(file.data, target)
        elif fmt == "keras":
            _keras(registry.load(ref), target)
        else:
            _pt2(file.data, target)
        shutil.copytree(target, folder, dirs_exist_ok=True)
    return {"onnx": "onnx", "keras": "keras", "pt2": "pytorch"}[fmt]


def _onnx(data: bytes, target: Path) -> None:
    import mlflow.onnx
    import onnx

    mlflow.onnx.save_model(onnx.load_from_string(data), str(target), pip_requirements=["onnx", "onnxruntime"])
    (target / "model.onnx").write_bytes(data)  # the registered bytes, whatever MLflow's writer does


def _keras(model, target: Path) -> None:
    import mlflow.keras

    mlflow.keras.save_model(model, str(target), pip_requirements=["keras", "tensorflow"])


def _pt2(data: bytes, target: Path) -> None:
    """The pytorch flavour with serialization_format pt2, written as mlflow.pytorch.save_model writes it, around our file."""
    import mlflow
    import torch
    import yaml
    from mlflow import pyfunc
    from mlflow.models import Model
    from mlflow.utils.environment import _mlflow_conda_env, _PythonEnv

    (target / "data").mkdir(parents=True)
    (target / "data" / "model.pt2").write_bytes(data)
    requirements = [f"torch=={torch.__version__}", f"mlflow=={mlflow.__version__}"]
    model = Model()
    model.add_flavor("pytorch", model_data="data", pytorch_version=str(torch.__version__), code=None)
    pyfunc.add_to_model(model, loader_module="mlflow.pytorch", data="data", conda_env="conda.yaml", python_env="python_env.yaml",
                        model_config={"device": None})
    model.save(str(target / MLMODEL))
    (target / "conda.yaml").write_text(yaml.safe_dump(_mlflow_conda_env(additional_pip_deps=requirements), default_flow_style=False))
    _PythonEnv.current().to_yaml(str(target / "python_env.yaml"))
    (target / "requirements.txt").write_text("\n".join(requirements))


__all__ = ["write_mlflow_model"]
