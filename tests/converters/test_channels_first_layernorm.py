"""A layer norm over the channel axis converts to PyTorch and ONNX (issue 34, item 10).

keras LayerNormalization(axis=1) on rank 3 to 5 inputs, and transformers' ConvNextLayerNorm with
data_format="channels_first": to PyTorch as ChannelsFirstLayerNorm (channels moved last around a LayerNorm), to ONNX as
LayerNormalization between two Transposes (a decomposition between them below opset 17), the report saying how; back to
Keras as axis=1. The oracle is the NumPy function below; every scale, bias and eps is random.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

keras = pytest.importorskip("keras")
torch = pytest.importorskip("torch")

import converters  # noqa: E402
from converters.onnx_adapter import FRAMEWORK as ONNX  # noqa: E402
from converters.torch_adapter.channels_first_layer_norm import ChannelsFirstLayerNorm  # noqa: E402
from schemas import spec_differences  # noqa: E402

CHANNELS = 5
SPATIAL = {1: (7,), 2: (4, 6), 3: (3, 4, 2)}


def numpy_channel_norm(x: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None, eps: float) -> np.ndarray:
    """Each position normalised over axis 1 (the channels), then the per-channel affine."""
    x = np.asarray(x, np.float64)
    mean, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if gamma is not None:
        y = y * np.asarray(gamma, np.float64).reshape(shape)
    if beta is not None:
        y = y + np.asarray(beta, np.float64).reshape(shape)
    return y


def keras_layer(spatial_rank: int, seed: int, center: bool = True):
    rng = np.random.default_rng(seed)
    eps = float(rng.choice([1e-3, 1e-5, 1e-6]))
    layer = keras.layers.LayerNormalization(axis=1, epsilon=eps, center=center, name=f"ln_cf{spatial_rank}")
    layer.build((None, CHANNELS) + SPATIAL[spatial_rank])
    gamma = rng.uniform(0.3, 2.5, CHANNELS).astype("float32")
    layer.gamma.assign(gamma)
    beta = None
    if center:
        beta = rng.normal(0, 1, CHANNELS).astype("float32")
        layer.beta.assign(beta)
    return layer, gamma, beta, eps


def data(spatial_rank: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 50)
    shape = (3, CHANNELS) + SPATIAL[spatial_rank]
    return (rng.normal(0, 2, shape) + rng.normal(0, 3, (1, CHANNELS) + (1,) * spatial_rank)).astype("float32")


def run(obj, x: np.ndarray) -> np.ndarray:
    if isinstance(obj, torch.nn.Module):
        with torch.no_grad():
            return obj(torch.tensor(x)).double().numpy()
    return np.asarray(ONNX.run_eval(obj, x), np.float64)


@pytest.mark.parametrize("spatial_rank", [1, 2, 3])
@pytest.mark.parametrize("center", [True, False])
def test_keras_axis_1_to_torch(spatial_rank, center):
    layer, gamma, beta, eps = keras_layer(spatial_rank, seed=spatial_rank + 10 * center, center=center)
    x = data(spatial_rank, seed=spatial_rank)
    module, report = converters.convert_with_report(layer, "torch")
    assert isinstance(module, ChannelsFirstLayerNorm) and tuple(module.normalized_shape) == (CHANNELS,)
    line = next(t for t in report.layers[0].translations if t.setting == "layout")
    assert line.fate == "exact" and line.target_value == "ChannelsFirstLayerNorm" and "movedim" in line.note
    want = numpy_channel_norm(x, gamma, beta, eps)
    np.testing.assert_allclose(run(module, x), want, atol=1e-5, rtol=1e-5)
    assert spec_differences(converters.to_spec(layer), converters.to_spec(module)) == []
    module.train()  # a layer norm computes the same in training
    np.testing.assert_allclose(run(module, x), want, atol=1e-5, rtol=1e-5)
    module.eval()
    back = converters.convert(module, "keras")
    assert list(np.atleast_1d(back.axis)) == [1]
    np.testing.assert_allclose(np.asarray(back(x), np.float64), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spatial_rank", [1, 2, 3])
@pytest.mark.parametrize("opset", [23, 13])
def test_keras_axis_1_to_onnx(spatial_rank, opset):
    layer, gamma, beta, eps = keras_layer(spatial_rank, seed=20 + spatial_rank)
    x = data(spatial_rank, seed=30 + spatial_rank)
    model, report = converters.convert_with_report(layer, "onnx", opset=opset)
    ops = [node.op_type for node in model.graph.node]
    assert ops[0] == ops[-1] == "Transpose"
    if opset >= 17:
        assert ops == ["Transpose", "LayerNormalization", "Transpose"]
        assert report.layers[0].target_op == "Transpose+LayerNormalization-17+Transpose"
    line = next(t for t in report.layers[0].translations if t.setting == "layout")
    assert line.fate == "exact" and line.target_value.startswith("Transpose[")
    want = numpy_channel_norm(x, gamma, beta, eps)
    np.testing.assert_allclose(run(model, x), want, atol=2e-5, rtol=1e-5)
    read = converters.to_spec(model)
    assert read.layout == "channels_first" and spec_differences(converters.to_spec(layer), read) == []
    back = converters.convert(model, "keras")
    assert list(np.atleast_1d(back.axis)) == [1]
    np.testing.assert_allclose(np.asarray(back(x), np.float64), want, atol=1e-5, rtol=1e-5)


def test_check_passes_every_framework():
    layer, *_ = keras_layer(1, seed=7)
    result = converters.check(layer)
    assert result.passed, result
    assert {t.framework: t.status for t in result.targets} == {"torch": "passed", "keras": "passed", "onnx": "passed"}


def test_convnext_channels_first_layer_norm_to_onnx_and_keras():
    """Another member of the family: transformers' ConvNextLayerNorm(data_format="channels_first"), random state."""
    modeling = pytest.importorskip("transformers.models.convnext.modeling_convnext")
    module = modeling.ConvNextLayerNorm(CHANNELS, eps=1e-6, data_format="channels_first")
    rng = np.random.default_rng(5)
    with torch.no_grad():
        module.weight.copy_(torch.tensor(rng.uniform(0.3, 2.5, CHANNELS)))
        module.bias.copy_(torch.tensor(rng.normal(0, 1, CHANNELS)))
    spec = converters.to_spec(module)
    assert spec.layout == "channels_first"
    x = data(2, seed=5)
    want = numpy_channel_norm(x, module.weight.detach().numpy(), module.bias.detach().numpy(), 1e-6)
    model, report = converters.convert_with_report(module, "onnx")
    assert [node.op_type for node in model.graph.node] == ["Transpose", "LayerNormalization", "Transpose"]
    np.testing.assert_allclose(run(model, x), want, atol=2e-5, rtol=1e-5)
    layer = converters.convert(module, "keras")
    np.testing.assert_allclose(np.asarray(layer(x), np.float64), want, atol=2e-5, rtol=1e-5)
    stock = converters.from_spec(spec.replace(source=converters.to_spec(layer).source), "torch")
    assert isinstance(stock, ChannelsFirstLayerNorm)
    np.testing.assert_allclose(run(stock, x), want, atol=1e-5, rtol=1e-5)
