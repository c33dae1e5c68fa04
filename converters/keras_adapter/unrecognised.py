"""The `unrecognised_normalization` hazard for Keras models: layers that look like a normalization and that no
recognizer proves.

Such a layer is not listed, converted, exported as a normalization or checked on registration,
so it must never pass silently. (The torch side reports the same hazard code.)
"""

from __future__ import annotations

from typing import Any

from schemas import UnsupportedObjectError
from schemas.inspection import Hazard

from .. import recognizers
from .keras_internals import all_layers
from .lookalike import looks_like_normalization
from .probe import probe_layer
from .runtime import import_keras

CODE = "unrecognised_normalization"


def layer_path(layer: Any) -> str:
    """The layer's path in its model where Keras records one (nested layers may share a name), else its name."""
    path = getattr(layer, "path", None)
    return path if isinstance(path, str) and path else layer.name


def unrecognised_hazards(model: Any) -> list[Hazard]:
    """One hazard per layer of `model` that looks like a normalization and that no Keras recognizer reads."""
    layers = all_layers(model) if isinstance(model, import_keras().layers.Layer) else []
    hazards = []
    for layer in layers:
        why = looks_like_normalization(layer)
        if why is None:
            continue
        try:
            if recognizers.kind_of("keras", layer) is not None:
                continue
        except UnsupportedObjectError as error:
            reason = str(error)
        else:
            reason = probe_layer(layer).reason
        hazards.append(
            Hazard(
                code=CODE,
                severity="error",
                layer=layer_path(layer),
                message=f"{type(layer).__module__}.{type(layer).__qualname__} '{layer_path(layer)}' looks like a normalization ({why}) but no "
                f"recognizer proves what it computes ({reason}); it is not listed, converted or checked as one: register a recognizer "
                "for it (converters.recognizers.register) or replace it by a stock keras.layers normalization.",
            )
        )
    return hazards
