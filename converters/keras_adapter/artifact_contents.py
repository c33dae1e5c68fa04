"""The contents of a keras.Model for an artifact: its variables by path, each layer's spec tensors looked for among its
own."""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.layer_errors import read_layer

from ..model_contents import ModelContents, ModelNormalizer, ModelTensor, hinted
from ..model_values import NormLayerRef
from ..models.walking import spec_of


def variable_name(model: Any, variable: Any) -> str:
    """A variable's tensor name: its path without the model's name, which it starts with in memory
    ('sequential/dense/kernel') but not after loading a .keras file ('dense/kernel'),
    so the same model has the same tensor names."""
    top = f"{model.name}/"
    return variable.path[len(top) :] if variable.path.startswith(top) else variable.path


def keras_contents(model: Any, refs: list[NormLayerRef]) -> ModelContents:
    """A keras.Model whose normalization layers the walk found as `refs` (no training mode: Keras layers hold none)."""
    specs = [(ref, read_layer(lambda ref=ref: spec_of(ref), ref.path)) for ref in refs]

    def name_of(variable: Any) -> str:
        return variable_name(model, variable)

    tensors = []
    for variable in model.weights:
        name = name_of(variable)
        tensors.append(ModelTensor(name, np.asarray(variable.numpy()), name.rpartition("/")[0] or None))
    normalizers = []
    for ref, spec in specs:
        layer_vars = [name_of(v) for v in ref.obj.weights]
        prefix = layer_vars[0].rpartition("/")[0] if layer_vars else ref.path
        normalizers.append(ModelNormalizer(ref.path, spec, hinted(prefix, layer_vars, "/")))
    return ModelContents("keras", "keras", tensors, normalizers, sites=len(refs), mode="n/a")


__all__ = ["keras_contents", "variable_name"]
