"""Serving taps of Keras models: sampled calls run a sub-model that also returns every BatchNormalization input.

Unsampled calls run the model itself. Sampled ones run `keras.Model(model.inputs, model.outputs + inputs of the
BatchNormalization layers the recognizers found)` (functional models, as `drift` reads them), and the wrapper returns
what the model returns: one tensor, or the list of its outputs. Should the sub-model fail, the model serves the call
and the failure is counted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas import UnsupportedObjectError

from ..serving_taps import ServingTaps, TappedLayer, TapSink, numpy_moments
from .runtime import import_keras


class MonitoredKerasModel:
    """Call it as the model (`served(x)`), or `predict`; sampled calls report their BatchNorm inputs."""

    def __init__(self, model: Any, probe: Any, axes: list[int], sink: TapSink):
        self.model, self._probe, self._axes, self._sink = model, probe, axes, sink
        self._outputs = len(model.outputs)

    def __call__(self, inputs, training: bool = False, **kwargs):
        keras = import_keras()
        try:
            if not training and self._sink.begin():
                flat = keras.tree.flatten(inputs)  # model.inputs order, as the probe takes them
                self._sink.keep(flat)  # copied by the collector only when it keeps a sample
                try:
                    values = self._probe(flat, training=False, **kwargs)  # model.inputs order, as the probe takes them
                except Exception as error:
                    self._sink.failed(error)
                else:
                    for index, (value, axis) in enumerate(zip(values[self._outputs :], self._axes)):
                        try:
                            self._sink.observe(index, *numpy_moments(keras.ops.convert_to_numpy(value), axis))
                        except Exception as error:
                            self._sink.failed(error)
                    served = list(values[: self._outputs])
                    return (
                        served[0] if self._outputs == 1 and not isinstance(self.model.output, (list, tuple)) else served
                    )
            return self.model(inputs, training=training, **kwargs)
        finally:
            self._sink.end()

    def predict(self, inputs, **kwargs):
        keras = import_keras()
        out = self(inputs)
        return (
            [keras.ops.convert_to_numpy(o) for o in out] if isinstance(out, list) else keras.ops.convert_to_numpy(out)
        )

    def __getattr__(self, name: str):
        return getattr(self.model, name)


def keras_taps(model: Any, refs: list, sink: TapSink) -> ServingTaps:
    """`model` served through a MonitoredKerasModel watching the BatchNormalization layers in `refs`."""
    keras = import_keras()
    layers = [ref.obj for ref in refs]
    try:
        probe = keras.Model(model.inputs, list(model.outputs) + [layer.input for layer in layers])
    except (AttributeError, ValueError) as error:
        raise UnsupportedObjectError(
            f"cannot read the BatchNormalization inputs of Keras model '{model.name}' ({error}); "
            "monitor a functional Keras model."
        ) from error
    tapped = [
        TappedLayer(
            layer.name,
            *(keras.ops.convert_to_numpy(w).astype(np.float64) for w in (layer.moving_mean, layer.moving_variance)),
            float(layer.epsilon),
        )
        for layer in layers
    ]
    axes = [layer.axis if isinstance(layer.axis, int) else layer.axis[0] for layer in layers]
    names = [getattr(tensor, "name", None) for tensor in model.inputs]
    return ServingTaps(MonitoredKerasModel(model, probe, axes, sink), tapped, input_names=names if all(names) else None)


__all__ = ["MonitoredKerasModel", "keras_taps"]
