"""Keras recalibration: BatchNorm statistics as a cumulative average, by Keras's own update.

Keras updates moving = m * moving + (1 - m) * batch in a training-mode call. With m = (k-1)/k
on the k-th batch this is exactly the cumulative average of the batch statistics that PyTorch's
momentum=None keeps. Keras's batch variance is the biased one; for the unbiased (PyTorch)
estimator every batch must hold the same number of values per channel, so one factor n/(n-1)
converts the average. A training-mode call also switches Dropout and noise layers on, so models
with such layers are refused rather than recalibrated on perturbed activations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas import InputFileError, UnsupportedObjectError

STOCHASTIC = ("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianDropout", "GaussianNoise", "AlphaDropout")


def _copy(model: Any) -> Any:
    from converters.keras_adapter.common import import_keras

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


def recalibrate_keras(model: Any, batches: list[tuple[np.ndarray, ...]], variance_estimator: str):
    """(new model, [(name, old mean, old var, new mean, new var, eps)], method); the input model is untouched."""
    from converters.keras_adapter.common import import_keras

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
