"""KerasFramework: recognise, classify and run Keras 3 normalization layers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from schemas import NotExpressibleError, UnsupportedObjectError

from .. import markers, recognizers
from ..adapter import FrameworkAdapter
from .runtime import import_keras
from .shapes import built_input_shape
from .variables import read_variable, write_variable


class KerasFramework(FrameworkAdapter):
    """The Keras 3 side of normbridge: layers are channels-last, modes are per call."""

    name = "keras"

    def kind_of(self, obj: Any) -> str:
        """The kind the Keras recognizers read (converters/recognizers/: the stock layers first)."""
        kind = recognizers.kind_of("keras", obj)
        if kind is not None:
            return kind
        from ..recognizers.keras_layers import CLASS_KINDS

        names = list(CLASS_KINDS)
        raise UnsupportedObjectError(
            f"got a {type(obj).__module__}.{type(obj).__qualname__}, expected a keras.layers {', '.join(names[:-1])} or {names[-1]}; "
            "pass the normalization layer itself, not a model or another layer.",
            layer=getattr(obj, "name", None),
        )

    def version(self) -> str:
        return import_keras().__version__

    def natural_layout(self) -> str:
        return "channels_last"

    def run_eval(self, obj: Any, x: np.ndarray) -> np.ndarray:
        """layer(x, training=False): inference mode never updates Keras's moving statistics."""
        built_input_shape(obj)  # calling an unbuilt layer would build it: refuse instead
        keras = import_keras()
        inputs = np.asarray(x).astype(obj.compute_dtype, copy=False)
        return np.asarray(keras.ops.convert_to_numpy(obj(inputs, training=False)))

    def run_train_step(self, obj: Any, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """layer(x, training=True), its moving statistics put back afterwards, so the caller's stay as they were."""
        if markers.recall(obj).get("kind") == "instance" and isinstance(obj, import_keras().layers.BatchNormalization):
            raise NotExpressibleError(
                "this BatchNormalization holds a tracked InstanceNorm's running statistics for eval; its training step pools the batch "
                "instead of normalising per instance; train the source layer instead.", layer=obj.name, setting="track_running_stats", target="keras")
        built_input_shape(obj)  # calling an unbuilt layer would build it: refuse instead
        keras = import_keras()
        inputs = np.asarray(x).astype(obj.compute_dtype, copy=False)
        with statistics_restored(obj):
            output = np.asarray(keras.ops.convert_to_numpy(obj(inputs, training=True)))
            moving_mean, moving_variance = getattr(obj, "moving_mean", None), getattr(obj, "moving_variance", None)
            return (
                output,
                None if moving_mean is None else read_variable(moving_mean),
                None if moving_variance is None else read_variable(moving_variance),
            )


@contextmanager
def statistics_restored(layer: Any) -> Iterator[None]:
    """The layer's non-trainable variables (the moving statistics a training call updates) put back bit for bit after the block.

    Cheaper than training a copy rebuilt from the config (a new layer and its variables took about 17 ms of the 45 ms a Keras
    leg of the check took per BatchNormalization); the caller's statistics are as they were once the step returns.
    """
    saved = [(variable, read_variable(variable)) for variable in layer.non_trainable_weights]
    try:
        yield
    finally:
        for variable, value in saved:
            write_variable(variable, value, layer=layer.name, setting=variable.path)
