"""Corrupt state is refused in every framework, naming the layer and the setting."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import converters
from schemas import NotExpressibleError, SpecError

from tests.spec_factory import make_spec


def torch_with(values: dict) -> torch.nn.Module:
    module = torch.nn.BatchNorm2d(6)
    with torch.no_grad():
        for name, value in values.items():
            getattr(module, name).copy_(torch.from_numpy(value))
    return module


def keras_with(values: dict):
    layer = converters.from_spec(make_spec("batch", name="kbn", layout="channels_last"), "keras")
    names = {"running_var": "moving_variance", "running_mean": "moving_mean", "weight": "gamma"}
    for name, value in values.items():
        getattr(layer, names[name]).assign(value)
    return layer


def onnx_with(values: dict):
    model = converters.from_spec(make_spec("batch", name="obn"), "onnx")
    for initializer in model.graph.initializer:
        for name, value in values.items():
            if initializer.name.endswith({"running_var": "var", "running_mean": "mean", "weight": "scale"}[name]):
                initializer.CopyFrom(numpy_helper.from_array(value, initializer.name))
    return model


BAD_STATES = [
    pytest.param(
        {"running_var": np.array([1, 1, -0.5, 1, 1, 1], np.float32)}, "running_var", "negative", id="negative-var"
    ),
    pytest.param(
        {"running_mean": np.array([0, np.nan, 0, 0, 0, 0], np.float32)}, "running_mean", "NaN or Inf", id="nan-mean"
    ),
    pytest.param({"weight": np.array([1, 1, 1, np.inf, 1, 1], np.float32)}, "scale", "NaN or Inf", id="inf-scale"),
]


@pytest.mark.parametrize("values, setting, phrase", BAD_STATES)
@pytest.mark.parametrize(
    "build, name",
    [(torch_with, "BatchNorm2d"), (keras_with, "kbn"), (onnx_with, "obn")],
    ids=["torch", "keras", "onnx"],
)
def test_corrupt_state_is_refused_on_read(build, name, values, setting, phrase):
    obj = build(values)
    with pytest.raises(SpecError) as info:
        converters.to_spec(obj)
    message = str(info.value)
    assert name in message and setting in message and phrase in message


def test_inconsistent_onnx_shapes_are_refused():
    model = converters.from_spec(make_spec("batch", name="obn"), "onnx")
    for initializer in model.graph.initializer:
        if initializer.name.endswith("var"):
            initializer.CopyFrom(numpy_helper.from_array(np.ones(5, np.float32), initializer.name))
    with pytest.raises(SpecError) as info:
        converters.to_spec(model)
    assert "obn" in str(info.value) and "(5,)" in str(info.value)


def test_keras_renorm_is_refused_naming_the_setting():
    import keras

    layer = keras.layers.BatchNormalization(renorm=True, name="renorm_bn")
    layer.build((None, 4))
    with pytest.raises(NotExpressibleError) as info:
        converters.to_spec(layer)
    assert "renorm_bn" in str(info.value) and "renorm" in info.value.setting


def test_train_mode_to_onnx_is_refused_by_default_and_allowed_when_asked():
    module = torch.nn.BatchNorm2d(3).train()
    with pytest.raises(NotExpressibleError) as info:
        converters.convert(module, "onnx")
    assert info.value.setting == "training" and "depends on the others in its batch" in str(info.value)
    model = converters.convert(module, "onnx", onnx_training_mode=True)
    node = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    assert onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == "training_mode")) == 1
