"""Finding the normalization layers of a PyTorch module or a Keras model, in execution order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas import NormSpec, UnsupportedObjectError

from ..api import read_spec
from ..adapters import REGISTRY


@dataclass(frozen=True)
class NormLayerRef:
    """One normalization layer inside a model: its path (torch) or name (Keras) and the object."""

    path: str
    obj: Any
    framework: str
    kind: str


def _kind(framework: str, obj: Any) -> str | None:
    try:
        return REGISTRY.framework(framework).kind_of(obj)
    except UnsupportedObjectError:
        return None


def norm_layers(model: Any) -> list[NormLayerRef]:
    """Every normalization layer of a torch.nn.Module or keras.Model, in definition order.

    For PyTorch, definition order (named_modules) is the order of execution for the
    sequential-style networks this tool targets; for Keras, the flattened layer order.
    """
    from .loading import framework_of_model

    framework = framework_of_model(model)
    found: list[NormLayerRef] = []
    if framework == "torch":
        import torch

        if not isinstance(model, torch.nn.Module):
            raise UnsupportedObjectError(f"got a {type(model).__name__}; expected a torch.nn.Module (call .module() on an ExportedProgram).")
        for path, module in model.named_modules():
            kind = _kind("torch", module)
            if kind is not None:
                found.append(NormLayerRef(path or type(module).__name__, module, "torch", kind))
    elif framework == "keras":
        layers = model._flatten_layers(include_self=False, recursive=True) if hasattr(model, "_flatten_layers") else [model]
        for layer in layers:
            kind = _kind("keras", layer)
            if kind is not None:
                found.append(NormLayerRef(layer.name, layer, "keras", kind))
    else:
        raise UnsupportedObjectError(f"norm_layers walks PyTorch and Keras models; got a {framework} model (use the ONNX graph tools).")
    return found


def spec_of(ref: NormLayerRef) -> NormSpec:
    """The layer's spec, named by its path in the model."""
    spec, _ = read_spec(ref.obj)
    return spec if spec.name == ref.path else spec.replace(name=ref.path)
