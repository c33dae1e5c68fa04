"""What the registry stores of a whole model, from a model object or file, through the model's adapter.

Framework-neutral: the framework that owns the model (an ExportedProgram is torch's) reads it with
its `ModelAdapter.artifact_contents`; files are loaded first without executing code from them
(`loading.load_model`). The registry turns the contents into a manifest and blobs (registry/artifact.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas import InputFileError, NormSpec

from ..adapters import REGISTRY
from ..model_contents import ModelContents
from .loading import load_model


def model_contents(model: Any) -> ModelContents:
    """The contents of a torch nn.Module, ExportedProgram, keras.Model, onnx.ModelProto, or a model file (.pt2, .keras,
    .onnx), with the model's structure (ModelAdapter.structure_of) so the registry can give it back runnable."""
    source = None
    if isinstance(model, (str, Path)):
        source = Path(model)
        model = load_model(source, checkpoint_folders=True)
    if isinstance(model, NormSpec):
        raise InputFileError(
            "got a single-layer spec folder; register a whole model (.pt2, .keras, .onnx, a torch module or an artifact folder)."
        )
    adapter = REGISTRY.model_adapter_of(model)
    contents = adapter.artifact_contents(model)
    contents.hazards = list(adapter.model_hazards(model, found=contents.sites))  # the layers were just read: not again
    contents.structure = adapter.structure_of(
        model, {t.name: t.array for t in contents.tensors}, source if source and source.is_file() else None
    )
    contents.private = source is not None
    return contents


__all__ = ["model_contents"]
