"""Loading model files without executing code from them.

Accepted: the model files of every registered framework (`REGISTRY.model_files()`, from each `FrameworkInfo`: `.pt2`, a
torch.export ExportedProgram read by `torch_adapter.pt2.archive` with no full unpickler; `.keras`, loaded with
safe_mode=True, so Lambda layers and other deserialised code are refused; `.onnx`), each loaded by its framework's model
adapter once its first bytes say it is one (`file_headers`), and a spec folder. Pickle-based formats (`.pt`, `.pth`,
`.pkl`, `.bin`, `.ckpt`) are refused: loading them can run arbitrary code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas import InputFileError

from ..adapters import REGISTRY
from .file_headers import check_model_header

PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt", ".joblib")


def supported() -> str:
    """The model files and folders `load_model` reads, as a message names them."""
    return ", ".join(described for _, described in REGISTRY.model_files().values()) + " or a spec folder"


def load_model(path: str | Path, *, checkpoint_folders: bool = False, runnable: bool = False) -> Any:
    """The model stored at `path`: ExportedProgram, keras.Model, onnx.ModelProto or NormSpec; with `checkpoint_folders`
    (what `inspect` and a registration read), a Hugging Face checkpoint folder too, as a torch.nn.Module whose weights
    other than its normalizations' stay on the meta device; with `runnable` (what `export` reads), a checkpoint folder
    as the program of its model with every weight loaded."""
    path = Path(path)
    if not path.exists():
        raise InputFileError(f"'{path}' does not exist; pass a {supported()}.")
    if path.is_dir() and not (path / "spec.json").exists():
        return _load_folder(path, checkpoint_folders, runnable)
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
    model_files = REGISTRY.model_files()
    if suffix in model_files:
        framework, _ = model_files[suffix]
        check_model_header(
            path
        )  # a file that is not a model is refused from its first bytes, before its framework reads it whole
        return REGISTRY.model_adapter(framework).load(path)
    raise InputFileError(f"'{path}' has an unknown format '{suffix}'; pass a {supported()}.")


def _load_folder(path: Path, checkpoint_folders: bool, runnable: bool) -> Any:
    """A model folder, read by the framework whose marker file it holds (FrameworkInfo.folder_markers: a Hugging Face
    checkpoint's config.json is torch's, transformers' PyTorch classes build it)."""
    framework = REGISTRY.folder_framework(path)
    if framework is None:
        raise InputFileError(
            f"'{path}' holds neither spec.json (a spec folder written by normbridge: spec.json + tensors.safetensors) nor "
            "config.json (a Hugging Face checkpoint folder written by save_pretrained: config.json + "
            "model.safetensors); pass one of those."
        )
    if runnable:
        return REGISTRY.model_adapter(framework).load_runnable(path)
    if not checkpoint_folders:
        raise InputFileError(
            f"'{path}' is a Hugging Face checkpoint folder, which `inspect`, `register`, `pull` and `export --to onnx` "
            "take, but not this command yet (porting, drift and serving commands: docs/checkpoint-folders.md); export "
            "the model with torch.export (.pt2)."
        )
    return REGISTRY.model_adapter(framework).load(path)
