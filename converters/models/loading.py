"""Loading model files without executing code from them.

Accepted: the model files of every registered framework (`adapters.MODEL_FILES`: `.pt2`, a
torch.export ExportedProgram read by `torch_adapter.pt2_archive` with no full unpickler;
`.keras`, loaded with safe_mode=True, so Lambda layers and other deserialised code are refused;
`.onnx`), each loaded by its framework's model adapter once its first bytes say it is one
(`file_headers`), and a spec folder. Pickle-based formats (`.pt`, `.pth`, `.pkl`, `.bin`, `.ckpt`) are refused: loading them
can run arbitrary code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas import InputFileError

from ..adapters import MODEL_FILES, REGISTRY
from .file_headers import check_model_header

PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt", ".joblib")
SUPPORTED = ", ".join(described for _, described in MODEL_FILES.values()) + " or a spec folder"


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
            f"'{path}' has a '{suffix}' extension, which names a pickle-based format (loading one can execute code), so it is not read; "
            "save the model with torch.export.save (.pt2), "
            "model.save (.keras) or as ONNX instead."
        )
    if suffix in MODEL_FILES:
        framework, _ = MODEL_FILES[suffix]
        check_model_header(path)  # a file that is not a model is refused from its first bytes, before its framework reads it whole
        return REGISTRY.model_adapter(framework).load(path)
    raise InputFileError(f"'{path}' has an unknown format '{suffix}'; pass a {SUPPORTED}.")


def framework_of_model(model: Any) -> str:
    """'torch', 'keras' or 'onnx' for a model object (ExportedProgram counts as torch)."""
    return REGISTRY.model_framework(model)
