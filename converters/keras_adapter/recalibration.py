"""Recalibrating the BatchNormalization statistics of Keras models: population statistics, wave by wave, in eval mode.

A copy of the model (clone_model and its weights) is read through sub-models, as `drift` reads it: per pass, one
returning the inputs of the wave's layers, called with training=False (Dropout and noise layers stay off, nothing is
updated by Keras), on a copy whose layers upstream already hold their new statistics. A layer's upstream layers are the
BatchNormalizations of the sub-model that computes its input. Each new mean and variance is its input's over every
sample (model_values.population_statistics), assigned to moving_mean and moving_variance in their dtype. Functional
and Sequential models only: a layer inside a nested model has no input reachable from the model's inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas import InputFileError, UnsupportedObjectError

from ..model_values import LayerMoments, Movement, first_line, population_statistics
from ..recalibration_waves import waves
from .keras_internals import all_layers
from .runtime import import_keras


def _copy(model: Any) -> Any:
    keras = import_keras()
    new = keras.models.clone_model(model)
    new.set_weights(model.get_weights())
    return new


def _sub_model(model: Any, layers: list) -> Any:
    keras = import_keras()
    try:
        return keras.Model(model.inputs, [layer.input for layer in layers])
    except (AttributeError, ValueError) as error:
        raise UnsupportedObjectError(
            f"layer '{layers[0].name}': its input cannot be read from Keras model '{model.name}' ({first_line(error)}); recalibrate a functional "
            "or Sequential Keras model (BatchNormalization layers called once, outside nested models), or its ONNX export."
        ) from error


def _axis(layer: Any) -> int:
    return layer.axis if isinstance(layer.axis, int) else layer.axis[0]


def recalibrate_keras(
    model: Any, batches: list[tuple[np.ndarray, ...]], variance_estimator: str
) -> tuple[Any, list[Movement], str]:
    """(new model, [(name, old mean, old var, new mean, new var, eps)], method); the input model is untouched."""
    keras = import_keras()
    new = _copy(model)
    layers = {layer.name: layer for layer in all_layers(new) if isinstance(layer, keras.layers.BatchNormalization)}
    before = {
        name: (np.array(bn.moving_mean.numpy()), np.array(bn.moving_variance.numpy())) for name, bn in layers.items()
    }
    upstream = {
        name: {layer.name for layer in all_layers(_sub_model(new, [bn])) if layer.name in layers}
        for name, bn in layers.items()
    }
    computed = {}
    for wave in waves(list(layers), upstream):
        probe = _sub_model(new, [layers[name] for name in wave])
        records = [
            LayerMoments(name, *(a.astype(np.float64) for a in before[name]), float(layers[name].epsilon))
            for name in wave
        ]
        for batch in batches:
            try:
                values = probe(
                    list(batch), training=False
                )  # the probe is built on model.inputs, a list: a bare tensor makes Keras warn
            except (
                Exception
            ) as error:  # Keras's ValueError, TensorFlow's InvalidArgumentError for a wrong shape or dtype
                raise InputFileError(
                    f"the Keras model refused a recalibration batch of shape {[list(a.shape) for a in batch]} ({first_line(error)})."
                ) from error
            values = values if isinstance(values, (list, tuple)) else [values]
            for record, value in zip(records, values):
                record.add(keras.ops.convert_to_numpy(value), _axis(layers[record.name]))
        for record in records:
            mean, var = population_statistics(record, variance_estimator)
            bn = layers[record.name]
            bn.moving_mean.assign(mean.astype(before[record.name][0].dtype))
            bn.moving_variance.assign(var.astype(before[record.name][1].dtype))
            computed[record.name] = (mean, var)
    moved = [(name, *before[name], *computed[name], float(layers[name].epsilon)) for name in layers]
    method = (
        "sub-models of a copy called with training=False: population statistics of each BatchNormalization's input over all samples "
        f"(pooled in float64), measured wave by wave with the layers upstream on their new statistics; {variance_estimator} variance"
    )
    return new, moved, method


__all__ = ["recalibrate_keras"]
