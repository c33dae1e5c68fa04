"""The contents of a torch model for an artifact: an nn.Module by its state_dict,
an ExportedProgram by its state and aten ops."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from schemas import NormbridgeError, UnsupportedObjectError
from schemas.layer_errors import read_layer

from ..adapters import REGISTRY
from ..model_contents import ModelContents, ModelNormalizer, ModelTensor, hint_index
from ..model_values import NormLayerRef
from ..models.walking import spec_of
from .common import numpy_from_tensor
from .pt2.payloads import tensor_sources
from .recognition.exported_program import exported_specs
from .torch_internals import norm_base_classes

#: The normalization module classes a walk must have read, or the model is refused (they would pass unchecked).
_NORM_MODULES = (*norm_base_classes(), torch.nn.GroupNorm, torch.nn.LayerNorm, torch.nn.RMSNorm)


def torch_array(tensor: Any, name: str) -> np.ndarray:
    """The tensor as NumPy; bfloat16 goes through ml_dtypes bit for bit (torch's .numpy() cannot make one)."""
    return numpy_from_tensor(tensor.detach().cpu())


def _tensors(state: dict[str, Any], sources: dict | None = None) -> list[ModelTensor]:
    """Each tensor as NumPy (sharing its memory, which a .pt2's large payloads map from the file) with where its bytes
    are."""
    sources = sources or {}
    return [
        ModelTensor(name, torch_array(tensor, name), name.rpartition(".")[0] or None, sources.get(name))
        for name, tensor in state.items()
    ]


def module_contents(module: torch.nn.Module, refs: list[NormLayerRef]) -> ModelContents:
    """An nn.Module whose normalization layers the walk found as `refs`; each spec tensor is looked for under its
    layer."""
    refuse_unread_layers(module, refs)
    specs = [(ref, read_layer(lambda ref=ref: spec_of(ref), ref.path)) for ref in refs]
    tensors = _tensors(module.state_dict(keep_vars=False))
    hints = hint_index(list(dict.fromkeys(t.name for t in tensors)), ".")
    normalizers = []
    for ref, spec in specs:
        prefix = "" if ref.obj is module else ref.path  # a bare layer: its state_dict keys have no prefix
        normalizers.append(ModelNormalizer(ref.path, spec, hints(prefix)))
    return ModelContents("torch", "torch-module", tensors, normalizers, sites=len(refs))


def refuse_unread_layers(module: torch.nn.Module, refs: list[NormLayerRef]) -> None:
    """A normalization module the walker passed over (SyncBatchNorm, a lazy or custom BatchNorm) refuses the model,
    naming it and why: registered, it would pass the gate unchecked."""
    read = {id(ref.obj) for ref in refs}
    for path, sub in module.named_modules():
        if isinstance(sub, _NORM_MODULES) and id(sub) not in read:
            try:
                REGISTRY.framework("torch").kind_of(sub)
                reason = f"normbridge did not read this {type(sub).__name__}"
            except NormbridgeError as error:
                reason = error.message
            raise UnsupportedObjectError(
                f"{reason.rstrip('.')}; a model is registered only when each of its normalization layers is checked.",
                layer=path or type(sub).__name__,
            )


def program_contents(program: Any) -> ModelContents:
    """An ExportedProgram: its parameters, buffers and tensor constants; each layer's tensors are looked for under its
    name."""
    specs = read_layer(lambda: exported_specs(program), None)  # refuses a layer it cannot read, naming it
    state = dict(program.state_dict)
    state.update({name: value for name, value in program.constants.items() if hasattr(value, "detach")})
    tensors = _tensors(state, tensor_sources(program))
    hints = hint_index(list(dict.fromkeys(t.name for t in tensors)), ".")
    normalizers = [ModelNormalizer(spec.name, spec, hints(spec.name)) for spec in specs]
    return ModelContents("torch", "pt2", tensors, normalizers, sites=len(specs))


__all__ = ["module_contents", "program_contents", "refuse_unread_layers", "torch_array"]
