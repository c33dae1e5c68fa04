"""BatchNorm input statistics of Keras models, and recalibration: a cumulative average, by Keras's own update.

The inputs are read by a sub-model that returns each BatchNormalization layer's input
(functional models only).

Keras updates moving = m * moving + (1 - m) * batch in a training-mode call. With m = (k-1)/k
on the k-th batch this is exactly the cumulative average of the batch statistics that PyTorch's
momentum=None keeps. Keras's batch variance is the biased one; for the unbiased (PyTorch)
estimator every batch must hold the same number of values per channel, so one factor n/(n-1)
converts the average. A training-mode call also switches Dropout and noise layers on, so models
with such layers are refused rather than recalibrated on perturbed activations.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from schemas import InputFileError, UnsupportedObjectError

from ..model_values import LayerMoments, Movement
from .runtime import import_keras

STOCHASTIC = ("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianDropout", "GaussianNoise", "AlphaDropout")


def _copy(model: Any) -> Any:
    keras = import_keras()
    new = keras.models.clone_model(model)
    new.set_weights(model.get_weights())
    return new


def _check(model: Any, batchnorms: list) -> None:
    stochastic = [layer.name for layer in model._flatten_layers(include_self=False, recursive=True) if type(layer).__name__ in STOCHASTIC]
    if stochastic:
        raise UnsupportedObjectError(
            f"the Keras model has stochastic layers ({', '.join(stochastic[:3])}) that a training-mode pass would switch on; "
            "recalibrate its ONNX export (normbridge export, then recalibrate the .onnx) instead."
        )
    for layer in batchnorms:
        if layer.renorm or not layer.trainable:
            setting = "renorm" if layer.renorm else "trainable"
            raise UnsupportedObjectError(
                f"layer '{layer.name}', setting '{setting}': Keras does not update this BatchNormalization's statistics in a training-mode call; "
                "set trainable=True (and renorm=False) on a copy first."
            )


def _values_per_channel(bn: Any, batch_size: int) -> int:
    """Values per channel in one batch at `bn`'s input: the batch size times the other non-channel sizes."""
    shape = list(bn.input.shape)
    axis = bn.axis if bn.axis >= 0 else len(shape) + bn.axis
    others = [d for i, d in enumerate(shape[1:], start=1) if i != axis]
    if any(d is None for d in others):
        raise InputFileError(
            f"layer '{bn.name}', setting 'variance_estimator': its input has unknown sizes {shape}, so the unbiased correction n/(n-1) is unknown; "
            "ask for variance_estimator='biased' (--biased)."
        )
    return batch_size * int(np.prod(others, dtype=np.int64))


def recalibrate_keras(model: Any, batches: list[tuple[np.ndarray, ...]], variance_estimator: str) -> tuple[Any, list[Movement], str]:
    """(new model, [(name, old mean, old var, new mean, new var, eps)], method); the input model is untouched."""
    keras = import_keras()
    new = _copy(model)
    batchnorms = [layer for layer in new._flatten_layers(include_self=False, recursive=True) if isinstance(layer, keras.layers.BatchNormalization)]
    _check(new, batchnorms)
    before = {bn.name: (np.array(bn.moving_mean.numpy()), np.array(bn.moving_variance.numpy())) for bn in batchnorms}
    batch_sizes = set()
    momenta = {bn.name: bn.momentum for bn in batchnorms}
    try:
        for k, batch in enumerate(batches, start=1):
            for bn in batchnorms:
                bn.momentum = (k - 1) / k  # cumulative average: the k-th batch weighs 1/k
            new(*batch, training=True) if len(batch) > 1 else new(batch[0], training=True)
            batch_sizes.add(int(batch[0].shape[0]))
    finally:
        for bn in batchnorms:
            bn.momentum = momenta[bn.name]
    if variance_estimator == "unbiased" and len(batch_sizes) != 1:
        raise InputFileError(
            "Keras averages the biased batch variance; the unbiased average needs batches of one size (pass batch_size so the data splits evenly), "
            "or ask for variance_estimator='biased'."
        )
    layers = []
    for bn in batchnorms:
        factor = 1.0
        if variance_estimator == "unbiased":
            n = _values_per_channel(bn, next(iter(batch_sizes)))
            factor = n / (n - 1)
        if factor != 1.0:
            bn.moving_variance.assign((np.asarray(bn.moving_variance.numpy(), np.float64) * factor).astype(bn.moving_variance.dtype))
        old_mean, old_var = before[bn.name]
        layers.append((bn.name, old_mean, old_var, np.array(bn.moving_mean.numpy()), np.array(bn.moving_variance.numpy()), float(bn.epsilon)))
    method = (
        "a copy called with training=True once per batch, each BatchNormalization's momentum set to (k-1)/k on the k-th batch "
        f"(the cumulative average); {variance_estimator} variance" + (" (Keras's biased average times n/(n-1))" if variance_estimator == "unbiased" else "")
    )
    return new, layers, method


def batchnorm_moments(model: Any, batches: Iterable[Sequence[np.ndarray]]) -> list[LayerMoments]:
    """BatchNormalization inputs of a functional Keras model, from a sub-model that returns each layer's input."""
    keras = import_keras()
    layers = [layer for layer in model._flatten_layers(include_self=False, recursive=True) if isinstance(layer, keras.layers.BatchNormalization)]
    if not layers:
        return []
    try:
        probe = keras.Model(model.inputs, [layer.input for layer in layers])
    except (AttributeError, ValueError) as error:
        raise UnsupportedObjectError(f"cannot read the BatchNormalization inputs of Keras model '{model.name}' ({error}); drift supports functional Keras models.") from error
    moments = []
    for layer in layers:
        mean, var = (keras.ops.convert_to_numpy(w).astype(np.float64) for w in (layer.moving_mean, layer.moving_variance))
        moments.append(LayerMoments(layer.name, mean, var, float(layer.epsilon)))
    axes = [layer.axis if isinstance(layer.axis, int) else layer.axis[0] for layer in layers]
    for batch in batches:
        values = probe(list(batch), training=False)  # the probe is built on model.inputs, a list: a bare tensor makes Keras warn
        values = values if isinstance(values, (list, tuple)) else [values]
        for record, value, axis in zip(moments, values, axes):
            record.add(keras.ops.convert_to_numpy(value), axis)
    return moments
