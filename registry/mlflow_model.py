"""The runnable MLflow model `normbridge mlflow push` writes beside a version's manifest, so MLflow can load,
serve and install it.

The pushed folder is both: the normbridge artifact (manifest.json; its blobs too when the version has no model file) and
an MLflow model (MLmodel and the model file), so `mlflow.pyfunc.load_model("models:/NAME/N")`, `mlflow models predict`
and `mlflow models serve` work on it. The model file is the version as `normbridge pull` gives it back
(registry/service/model_files.py): ONNX through the onnx flavour (the registered bytes), Keras through the keras flavour
(a .keras file, loaded by MLflow with Keras' own loader), a .pt2 through the pytorch flavour with serialization_format
pt2 (its sample inputs record is empty, so MLflow's pickle-free check passes) and a pyfunc flavour of its own
(registry/mlflow_pt2_pyfunc.py, shipped in the model's code/ folder): MLflow's pytorch pyfunc can neither load a
transformers program nor call it by keyword.

Every model gets a signature (its inputs' names, dtypes and shapes, an open batch as -1) and an input example (one
request of the contract's seeded random sample, in the model's own dtypes), so MLflow casts JSON numbers to float32
for a float32 model. Requirements are given, never inferred (inferring runs the model in a subprocess), and pinned to
versions PyPI holds: a local version label (torch's "+cpu") is not one. A torch nn.Module version has no structure:
its folder stays a bundle only.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np

from converters.adapters import REGISTRY
from converters.models.serving.samples import input_specs, random_sample
from schemas.errors import NormbridgeError

MLMODEL = "MLmodel"
PT2_LOADER = "normbridge_pt2_pyfunc"  # the module name of registry/mlflow_pt2_pyfunc.py in the model's code/ folder
#: Modules whose classes torch's pytree knows without an import.
_BUILTIN_TREE_MODULES = ("builtins", "collections", "torch")


def write_mlflow_model(registry, ref: str, folder: Path) -> str | None:
    """Add the MLflow model of version `ref` into `folder`; the flavour written,
    or None when the version has no model file."""
    manifest = registry.manifest(ref)
    if (
        manifest.structure is None or manifest.structure.format in REGISTRY.folder_formats()
    ):  # a folder: its bundle goes up
        return None
    fmt = manifest.structure.format
    file = registry.model_file(ref)
    model = registry.load(ref)
    signature, example = input_signature(model)
    with tempfile.TemporaryDirectory(prefix="normbridge-mlmodel-") as tmp:
        target = Path(tmp) / "model"
        if fmt == "onnx":
            _onnx(file.data, target, signature)
        elif fmt == "keras":
            _keras(model, target, signature)
        else:
            _pt2(file.data, model, target)
        describe_inputs(target, signature, example)
        shutil.copytree(target, folder, dirs_exist_ok=True)
    return {info.structure_format: info.mlflow_flavour for info in REGISTRY.infos()}[fmt]


def pinned(module: str) -> str:
    """The requirement installing `module` at the version installed here, as PyPI names it: 'torch==2.13.0' for torch
    2.13.0+cpu (a local version label is no release PyPI holds), 'tensorflow_cpu==2.21.0' where that provides
    tensorflow; the bare name when no installed distribution provides the module."""
    from packaging.version import Version

    top = module.split(".")[0]
    for distribution in [top, *importlib.metadata.packages_distributions().get(top, [])]:
        try:
            return f"{distribution}=={Version(importlib.metadata.version(distribution)).public}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return top


def input_signature(model):
    """(MLflow signature of the model's inputs, one request of the contract's seeded sample as an input example), or
    (None, None) when the model's inputs cannot be sampled."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    try:
        specs = input_specs(model)
        sample = random_sample(
            specs, batch_size=1
        )  # the contract's seeded sample in the inputs' dtypes; one request where the batch is open
    except NormbridgeError:  # inputs no sample can be drawn for (strings): MLflow serves the model without a signature
        return None, None
    schema = Schema(
        [
            TensorSpec(np.dtype(spec.dtype), tuple(-1 if d is None else d for d in spec.shape), spec.name)
            for spec in specs
        ]
    )
    return ModelSignature(inputs=schema), dict(zip(sample.names, sample.arrays))


def describe_inputs(target: Path, signature, example: dict | None) -> None:
    """Give the saved MLflow model at `target` its signature and input example (written here: MLflow's writers would run
    the model on the example to check it)."""
    import mlflow
    from mlflow.models import Model

    if signature is None:
        return
    meta = Model.load(str(target / MLMODEL))
    meta.signature = signature
    # MLflow's private writer of an example (mlflow.models.utils._save_example), the one that does not run the model
    try:
        from mlflow.models.utils import _save_example

        _save_example(meta, example, str(target))
    except Exception as error:  # a release that renamed it: the model still has its signature, and the push says so
        warnings.warn(
            f"MLflow {mlflow.__version__} cannot write the input example without running the model "
            f"({type(error).__name__}); the model is pushed with its signature and no input example.",
            stacklevel=2,
        )
    meta.save(str(target / MLMODEL))


def _onnx(data: bytes, target: Path, signature) -> None:
    import mlflow.onnx
    import onnx

    mlflow.onnx.save_model(
        onnx.load_from_string(data),
        str(target),
        signature=signature,
        pip_requirements=[pinned("onnx"), pinned("onnxruntime")],
    )
    (target / "model.onnx").write_bytes(data)  # the registered bytes, whatever MLflow's writer does


def _keras(model, target: Path, signature) -> None:
    import mlflow.keras

    mlflow.keras.save_model(
        model, str(target), signature=signature, pip_requirements=[pinned("keras"), pinned("tensorflow")]
    )


def _pt2(data: bytes, program, target: Path) -> None:
    """The pytorch flavour with serialization_format pt2 around our file, served through our own pyfunc loader."""
    import torch
    import yaml
    from mlflow import pyfunc
    from mlflow.models import Model
    from mlflow.utils.environment import _mlflow_conda_env, _PythonEnv

    (target / "data").mkdir(parents=True)
    (target / "data" / "model.pt2").write_bytes(data)
    (target / "code").mkdir()
    shutil.copyfile(Path(__file__).with_name("mlflow_pt2_pyfunc.py"), target / "code" / f"{PT2_LOADER}.py")
    modules = pytree_modules(program)
    requirements = sorted({pinned("torch"), pinned("numpy"), pinned("mlflow"), *(pinned(m) for m in modules)})
    model = Model()
    model.add_flavor("pytorch", model_data="data", pytorch_version=str(torch.__version__), code=None)
    pyfunc.add_to_model(
        model,
        loader_module=PT2_LOADER,
        data="data",
        code="code",
        conda_env="conda.yaml",
        python_env="python_env.yaml",
        model_config={"pytree_modules": modules},
    )
    model.save(str(target / MLMODEL))
    (target / "conda.yaml").write_text(
        yaml.safe_dump(_mlflow_conda_env(additional_pip_deps=requirements), default_flow_style=False)
    )
    _PythonEnv.current().to_yaml(str(target / "python_env.yaml"))
    (target / "requirements.txt").write_text("\n".join(requirements) + "\n")


def pytree_modules(program) -> list[str]:
    """The modules defining the classes of the program's inputs and outputs (transformers' ModelOutput subclasses):
    torch.export.load can rebuild the program only once they are imported, which registers them with torch's pytree."""
    found: set[str] = set()

    def walk(spec) -> None:
        kind = getattr(spec, "type", None)
        if kind is not None and kind.__module__.split(".")[0] not in _BUILTIN_TREE_MODULES:
            found.add(kind.__module__)
        children = spec.children() if callable(getattr(spec, "children", None)) else spec.children_specs
        for child in children:
            walk(child)

    for spec in (program.call_spec.in_spec, program.call_spec.out_spec):
        if spec is not None:
            walk(spec)
    return sorted(found)


__all__ = ["describe_inputs", "input_signature", "pinned", "pytree_modules", "write_mlflow_model"]
