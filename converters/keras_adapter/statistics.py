"""BatchNorm input statistics of Keras models (drift reads them here; recalibration is recalibration.py's).

The inputs are read by a sub-model that returns each BatchNormalization layer's input
(functional models only).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from schemas import UnsupportedObjectError

from ..model_values import LayerMoments
from .keras_internals import all_layers
from .runtime import import_keras


def batchnorm_moments(model: Any, batches: Iterable[Sequence[np.ndarray]]) -> list[LayerMoments]:
    """BatchNormalization inputs of a functional Keras model, from a sub-model that returns each layer's input."""
    keras = import_keras()
    layers = [layer for layer in all_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]
    if not layers:
        return []
    try:
        probe = keras.Model(model.inputs, [layer.input for layer in layers])
    except (AttributeError, ValueError) as error:
        raise UnsupportedObjectError(
            f"cannot read the BatchNormalization inputs of Keras model '{model.name}' ({error}); drift supports functional Keras models."
        ) from error
    moments = []
    for layer in layers:
        mean, var = (
            keras.ops.convert_to_numpy(w).astype(np.float64) for w in (layer.moving_mean, layer.moving_variance)
        )
        moments.append(LayerMoments(layer.name, mean, var, float(layer.epsilon)))
    axes = [layer.axis if isinstance(layer.axis, int) else layer.axis[0] for layer in layers]
    for batch in batches:
        values = probe(
            list(batch), training=False
        )  # the probe is built on model.inputs, a list: a bare tensor makes Keras warn
        values = values if isinstance(values, (list, tuple)) else [values]
        for record, value, axis in zip(moments, values, axes):
            record.add(keras.ops.convert_to_numpy(value), axis)
    return moments
