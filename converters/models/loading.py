"""Loading model files without executing code from them.

Accepted: `.pt2` (a torch.export ExportedProgram), `.keras` (loaded with safe_mode=True, so
Lambda layers and other deserialised code are refused), `.onnx`, and a spec folder. Pickle-based
formats (`.pt`, `.pth`, `.pkl`, `.bin`, `.ckpt`) are refused: loading them can run arbitrary code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas import InputFileError

PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt", ".joblib")
SUPPORTED = ".pt2 (torch.export), .keras, .onnx or a spec folder"


def load_model(path: str | Path) -> Any:
    """The model stored at `path`: ExportedProgram, keras.Model, onnx.ModelProto or NormSpec."""
    path = Path(path)
    if not path.exists():
        raise InputFileError(f"'{path}' does not exist; pass a {SUPPORTED}.")
    if path.is_dir() or path.name == "spec.json":
        from schemas import load_spec

        return load_spec(path)
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        raise InputFileError(
            f"'{path}' is a pickle-based file and loading it can execute code; save the model with torch.export.save (.pt2), "
            "model.save (.keras) or as ONNX instead."
        )
    if suffix == ".onnx":
        from converters.onnx_adapter.files import load_onnx

        return load_onnx(path)
    if suffix == ".pt2":
        return _load_pt2(path)
    if suffix == ".keras":
        return _load_keras(path)
    raise InputFileError(f"'{path}' has an unknown format '{suffix}'; pass a {SUPPORTED}.")


def _load_pt2(path: Path) -> Any:
    import torch

    try:
        return torch.export.load(str(path))
    except Exception as error:  # torch raises many types for a bad archive
        raise InputFileError(f"'{path}' is not a readable torch.export .pt2 archive ({type(error).__name__}: {error}).") from error


def _load_keras(path: Path) -> Any:
    from converters.keras_adapter.common import import_keras

    keras = import_keras()
    try:
        return keras.saving.load_model(str(path), safe_mode=True, compile=False)
    except ValueError as error:
        if "safe_mode" in str(error) or "Lambda" in str(error):
            raise InputFileError(
                f"'{path}' holds code (a Lambda layer or a deserialised function), which safe_mode refuses to run; rebuild the model without it."
            ) from error
        raise InputFileError(f"'{path}' is not a loadable .keras file ({error}).") from error
    except Exception as error:
        raise InputFileError(f"'{path}' is not a loadable .keras file ({type(error).__name__}: {error}).") from error


def framework_of_model(model: Any) -> str:
    """'torch', 'keras' or 'onnx' for a model object (ExportedProgram counts as torch)."""
    from ..adapter import owning_framework
    from ..adapters import REGISTRY

    name = owning_framework(model, REGISTRY.framework_names)
    if name is not None:
        return name
    raise InputFileError(f"got a {type(model).__module__}.{type(model).__qualname__}, expected a PyTorch, Keras or ONNX model.")
