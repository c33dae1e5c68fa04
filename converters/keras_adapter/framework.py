"""KerasFramework: recognise, classify and run Keras 3 normalization layers."""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas import UnsupportedObjectError

from .. import recognizers
from ..adapter import FrameworkAdapter
from .deferred import built_copy, is_deferred
from .keras_internals import plain_graphs_available
from .runtime import import_keras
from .shapes import built_input_shape
from .traced import refuse_instance_training, traced_calls
from .variables import read_variable, write_variable


class KerasFramework(FrameworkAdapter):
    """The Keras 3 side of normbridge: layers are channels-last, modes are per call."""

    name = "keras"

    def kind_of(self, obj: Any) -> str:
        """The kind the Keras recognizers read (converters/recognizers/: the stock layers first)."""
        kind = recognizers.kind_of("keras", obj)
        if kind is not None:
            return kind
        from .recognizers.layers import CLASS_KINDS

        names = list(CLASS_KINDS)
        raise UnsupportedObjectError(
            f"got a {type(obj).__module__}.{type(obj).__qualname__}, expected a keras.layers {', '.join(names[:-1])} or {names[-1]}; "
            "pass the normalization layer itself, not a model or another layer.",
            layer=getattr(obj, "name", None),
        )

    def restore(self, spec):
        """The custom class a probed spec was read from (keras_hub's RMSNormalization), rebuilt and proved equal
        (restoring.py), else (None, why)."""
        from .restoring import restore_class

        return restore_class(spec)

    def version(self) -> str:
        return import_keras().__version__

    def natural_layout(self) -> str:
        return "channels_last"

    def run_eval(self, obj: Any, x: np.ndarray, in_place: bool = False) -> np.ndarray:
        """layer(x, training=False): inference mode never updates Keras's moving statistics."""
        if is_deferred(
            obj
        ):  # built on its first call: run a copy built for this input, so the layer keeps its open rank
            obj = built_copy(obj, np.ndim(x))
        built_input_shape(obj)  # calling an unbuilt layer would build it: refuse instead
        keras = import_keras()
        inputs = np.asarray(x).astype(obj.compute_dtype, copy=False)
        return np.asarray(keras.ops.convert_to_numpy(obj(inputs, training=False)))

    def run_train_step(
        self, obj: Any, x: np.ndarray, in_place: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """layer(x, training=True) on a copy, so the caller's moving statistics stay as they were
        (on the layer itself if `in_place`)."""
        refuse_instance_training(obj)
        keras = import_keras()
        clone = built_copy(obj, np.ndim(x)) if is_deferred(obj) else (obj if in_place else copy_layer(obj))
        inputs = np.asarray(x).astype(clone.compute_dtype, copy=False)
        output = np.asarray(keras.ops.convert_to_numpy(clone(inputs, training=True)))
        moving_mean, moving_variance = getattr(clone, "moving_mean", None), getattr(clone, "moving_variance", None)
        return (
            output,
            None if moving_mean is None else read_variable(moving_mean),
            None if moving_variance is None else read_variable(moving_variance),
        )

    def kept_runs(self, obj: Any) -> Any:
        """The layer's traced eval and training calls (traced.py), for a layer built and run again and again; none (it
        runs eagerly) where TensorFlow cannot run them without grappler's rewrites
        (keras_internals.plain_graphs_available)."""
        if is_deferred(obj) or not plain_graphs_available():
            return None
        return traced_calls(obj)


def copy_layer(layer: Any) -> Any:
    """A built copy of `layer`: same class and config (trainable included), variables copied bit-exactly."""
    shape = built_input_shape(layer)
    clone = type(layer).from_config(layer.get_config())
    clone.build(shape)
    names = [v.path.rsplit("/", 1)[-1] for v in layer.weights]
    if [v.path.rsplit("/", 1)[-1] for v in clone.weights] != names:
        raise UnsupportedObjectError(
            f"a {type(layer).__name__} rebuilt from its config has other variables than {names}, expected the same; it cannot be copied for a training step.",
            layer=layer.name,
        )
    for ours, theirs, name in zip(layer.weights, clone.weights, names):
        write_variable(theirs, read_variable(ours), layer=layer.name, setting=name)
    return clone
