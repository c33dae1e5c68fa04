"""A Keras layer's configuration survives a trip through PyTorch or ONNX and back (issue 34, item 9).

BatchNormalization(axis=1) and GroupNormalization(axis=1) come back with axis=1 (spec.chosen_layout, kept by the
other frameworks for the way back), BatchNormalization(synchronized=True) with synchronized=True (spec.synchronized,
stored with a report line where the target cannot sync). Every state is random; the oracle is the NumPy code below, on
channels-first data given to the returned layer as it is (no transpose), eval and one training step.
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
from schemas import SpecError  # noqa: E402

from tests.spec_factory import make_spec  # noqa: E402

SPATIAL = {1: (6,), 2: (4, 5), 3: (3, 4, 2)}
CHANNELS = 4


def randomize(layer, seed: int) -> dict[str, np.ndarray]:
    """Random values in every variable (variances positive); returns them by variable name."""
    rng = np.random.default_rng(seed)
    values = {}
    for variable in layer.weights:
        name = variable.path.rsplit("/", 1)[-1]
        shape = tuple(variable.shape)
        value = rng.uniform(0.3, 2.5, shape) if name in ("gamma", "moving_variance") else rng.normal(0, 1.2, shape)
        variable.assign(value.astype("float32"))
        values[name] = value.astype("float32").astype(np.float64)
    return values


def channels_first_data(spatial_rank: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 99)
    shape = (3, CHANNELS) + SPATIAL[spatial_rank]
    offsets = rng.normal(0, 2, (1, CHANNELS) + (1,) * spatial_rank)
    spread = rng.uniform(0.5, 3, (1, CHANNELS) + (1,) * spatial_rank)
    return (rng.normal(0, 1, shape) * spread + offsets).astype("float32")


def broadcast(values: np.ndarray, rank: int) -> np.ndarray:
    return values.reshape((1, -1) + (1,) * (rank - 2))


def numpy_batch_eval(x, v, eps):
    rank = x.ndim
    y = (x - broadcast(v["moving_mean"], rank)) / np.sqrt(broadcast(v["moving_variance"], rank) + eps)
    return y * broadcast(v["gamma"], rank) + broadcast(v["beta"], rank)


def numpy_batch_step(x, v, eps, momentum):
    """Keras's step on channels-first data: statistics over every axis but 1, the biased variance folded in."""
    axes = (0,) + tuple(range(2, x.ndim))
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    y = (x - broadcast(mean, x.ndim)) / np.sqrt(broadcast(var, x.ndim) + eps)
    y = y * broadcast(v["gamma"], x.ndim) + broadcast(v["beta"], x.ndim)
    moved_mean = momentum * v["moving_mean"] + (1 - momentum) * mean
    return y, moved_mean, momentum * v["moving_variance"] + (1 - momentum) * var


def numpy_group(x, v, eps, groups):
    n, c = x.shape[:2]
    grouped = x.reshape((n, groups, -1))
    mean, var = grouped.mean(axis=2, keepdims=True), grouped.var(axis=2, keepdims=True)
    y = ((grouped - mean) / np.sqrt(var + eps)).reshape(x.shape)
    return y * broadcast(v["gamma"], x.ndim) + broadcast(v["beta"], x.ndim)


def config_without_name(layer) -> dict:
    return {k: v for k, v in layer.get_config().items() if k != "name"}


def there_and_back(layer, via: str):
    middle, there = converters.convert_with_report(layer, via)
    back, again = converters.convert_with_report(middle, "keras")
    return middle, back, there.layers[0], again.layers[0]


@pytest.mark.parametrize("via", ["torch", "onnx"])
@pytest.mark.parametrize("spatial_rank", [1, 2, 3])
def test_channels_first_batch_normalization_comes_back_with_axis_1(via, spatial_rank):
    layer = keras.layers.BatchNormalization(axis=1, momentum=0.9, epsilon=1e-3, name="bn_cf")
    layer.build((None, CHANNELS) + SPATIAL[spatial_rank])
    values = randomize(layer, seed=spatial_rank)
    spec = converters.to_spec(layer)
    assert (spec.layout, spec.chosen_layout) == ("channels_first", "channels_first")
    middle, back, there, again = there_and_back(layer, via)
    assert back.axis == 1 and config_without_name(back) == config_without_name(layer)
    assert {t.setting: t.fate for t in there.translations}[
        "chosen_layout"
    ] == "stored"  # the way there says it keeps it
    fates = {t.setting: t.fate for t in again.translations}
    assert fates["layout"] == "exact" and fates["chosen_layout"] == "exact"
    for ours, theirs in zip(layer.weights, back.weights):
        assert np.asarray(ours.numpy()).tobytes() == np.asarray(theirs.numpy()).tobytes()
    x = channels_first_data(spatial_rank, seed=spatial_rank)
    want = numpy_batch_eval(x.astype(np.float64), values, 1e-3)
    np.testing.assert_allclose(np.asarray(back(x, training=False)), want, atol=2e-5, rtol=1e-5)
    y, mean, var = numpy_batch_step(x.astype(np.float64), values, 1e-3, 0.9)
    np.testing.assert_allclose(np.asarray(back(x, training=True)), y, atol=3e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(back.moving_mean.numpy()), mean, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(back.moving_variance.numpy()), var, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("via", ["torch", "onnx"])
@pytest.mark.parametrize("spatial_rank, groups", [(1, 2), (2, 1), (3, 4)])
def test_channels_first_group_normalization_comes_back_with_axis_1(via, spatial_rank, groups):
    """groups=4 of 4 channels is an instance norm (kind instance), the others kind group: both come back axis=1."""
    layer = keras.layers.GroupNormalization(groups=groups, axis=1, epsilon=1e-4, name="gn_cf")
    layer.build((None, CHANNELS) + SPATIAL[spatial_rank])
    values = randomize(layer, seed=10 + spatial_rank)
    middle, back, there, again = there_and_back(layer, via)
    assert back.axis == 1 and config_without_name(back) == config_without_name(layer)
    x = channels_first_data(spatial_rank, seed=20 + spatial_rank)
    want = numpy_group(x.astype(np.float64), values, 1e-4, groups)
    for training in (False, True):
        np.testing.assert_allclose(np.asarray(back(x, training=training)), want, atol=3e-5, rtol=1e-5)


@pytest.mark.parametrize("via", ["torch", "onnx"])
def test_synchronized_comes_back_and_is_reported(via):
    layer = keras.layers.BatchNormalization(synchronized=True, momentum=0.95, name="bn_sync")
    layer.build((None, 5, 5, CHANNELS))
    randomize(layer, seed=3)
    assert converters.to_spec(layer).synchronized
    middle, back, there, again = there_and_back(layer, via)
    assert back.synchronized is True and config_without_name(back) == config_without_name(layer)
    line = next(t for t in there.translations if t.setting == "synchronized")
    assert line.fate == "stored"
    if via == "torch":
        assert isinstance(middle, torch.nn.BatchNorm2d)
        assert any("convert_sync_batchnorm" in w for w in there.warnings)
    assert next(t for t in again.translations if t.setting == "synchronized").fate == "exact"


def test_natural_layouts_are_unchanged():
    """A channels-last Keras layer comes back channels-last; a PyTorch layer goes to Keras channels-last, as before."""
    layer = keras.layers.BatchNormalization(name="bn_cl")
    layer.build((None, 5, 5, CHANNELS))
    assert converters.to_spec(layer).chosen_layout is None
    assert converters.convert(converters.convert(layer, "torch"), "keras").axis == -1
    assert converters.convert(torch.nn.BatchNorm2d(3), "keras").axis == -1
    assert converters.convert(torch.nn.GroupNorm(1, 4), "keras").axis == -1


def test_settings_that_do_not_apply_are_refused():
    batch, group, layer = make_spec("batch"), make_spec("group"), make_spec("layer")
    with pytest.raises(SpecError) as info:
        group.replace(synchronized=True)
    assert info.value.setting == "synchronized"
    with pytest.raises(SpecError) as info:
        layer.replace(chosen_layout="channels_first")
    assert info.value.setting == "chosen_layout"
    assert "synchronized" not in batch.config_dict()  # manifests registered before the fields keep their digest
    assert "chosen_layout" not in batch.config_dict()
    assert batch.replace(synchronized=True).config_dict()["synchronized"] is True
