"""Finding the normalization layers of a PyTorch module or a Keras model, in execution order
(through its model adapter)."""

from __future__ import annotations

from typing import Any

from schemas import NormSpec

from ..adapters import REGISTRY
from ..api import layer_spec
from ..model_values import NormLayerRef


def norm_layers(model: Any) -> list[NormLayerRef]:
    """Every normalization layer of a torch.nn.Module or keras.Model, in definition order.

    For PyTorch, definition order (named_modules) is the order of execution for the
    sequential-style networks this tool targets; for Keras, the flattened layer order.
    """
    return REGISTRY.model_adapter_of(model).norm_layers(model)


def spec_of(ref: NormLayerRef) -> NormSpec:
    """The layer's spec, named by its path in the model."""
    return layer_spec(ref)


__all__ = ["NormLayerRef", "norm_layers", "spec_of"]
