"""A tracked PyTorch InstanceNorm{1,2,3}d in Keras: eval, a training step and its statistics as PyTorch's (issue 34/8).

Keras has no such layer; normbridge emits TrackedInstanceNormalization, a BatchNormalization whose training step is
PyTorch's. The oracle is the NumPy function below (written from torch.nn.functional.instance_norm's documented
semantics, not from converters.reference), and PyTorch itself on the same input. Every state is random.
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
from converters.keras_adapter import FRAMEWORK  # noqa: E402
from converters.keras_adapter.tracked_instance_normalization import TrackedInstanceNormalization  # noqa: E402
from schemas import NotExpressibleError, spec_differences  # noqa: E402

CLASSES = {1: torch.nn.InstanceNorm1d, 2: torch.nn.InstanceNorm2d, 3: torch.nn.InstanceNorm3d}
SPATIAL = {1: (7,), 2: (5, 6), 3: (3, 4, 5)}


def numpy_step(x: np.ndarray, state: dict, momentum: float, eps: float, batched: bool) -> tuple[np.ndarray, ...]:
    """(training output, running_mean, running_var) after one step, channels-first, float64.

    Per (sample, channel) over the spatial axes; the running statistics move by the batch mean of the per-instance mean
    and unbiased variance (n = spatial size), with momentum as PyTorch's batch weight. No batch axis: one instance."""
    x = np.asarray(x, np.float64) if batched else np.asarray(x, np.float64)[None]
    axes = tuple(range(2, x.ndim))
    n = int(np.prod(x.shape[2:]))
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean) / np.sqrt(var + eps)
    if "weight" in state:
        y = y * state["weight"].reshape(shape) + state["bias"].reshape(shape)
    running_mean = (1 - momentum) * state["running_mean"] + momentum * mean.reshape(x.shape[:2]).mean(axis=0)
    unbiased = var.reshape(x.shape[:2]) * n / (n - 1)
    running_var = (1 - momentum) * state["running_var"] + momentum * unbiased.mean(axis=0)
    return (y if batched else y[0]), running_mean, running_var


def numpy_eval(x: np.ndarray, state: dict, eps: float) -> np.ndarray:
    """Eval: each channel normalised with the running statistics (channel axis 1 batched, 0 without a batch axis)."""
    x = np.asarray(x, np.float64)
    channel = 1 if x.ndim == len(state["_spatial"]) + 2 else 0
    shape = [1] * x.ndim
    shape[channel] = -1
    y = (x - state["running_mean"].reshape(shape)) / np.sqrt(state["running_var"].reshape(shape) + eps)
    if "weight" in state:
        y = y * state["weight"].reshape(shape) + state["bias"].reshape(shape)
    return y


def random_instance_norm(spatial_rank: int, seed: int, affine: bool = True, channels: int = 4):
    """A torch InstanceNorm with tracked statistics, every state and the momentum and eps random."""
    rng = np.random.default_rng(seed)
    momentum, eps = float(rng.choice([0.1, 0.05, 0.3])), float(rng.choice([1e-5, 1e-3]))
    module = CLASSES[spatial_rank](channels, eps=eps, momentum=momentum, affine=affine, track_running_stats=True)
    with torch.no_grad():
        if affine:
            module.weight.copy_(torch.tensor(rng.uniform(0.3, 2.5, channels)))
            module.bias.copy_(torch.tensor(rng.normal(0, 1, channels)))
        module.running_mean.copy_(torch.tensor(rng.normal(0, 1.5, channels)))
        module.running_var.copy_(torch.tensor(rng.uniform(0.2, 3.0, channels)))
        module.num_batches_tracked.fill_(int(rng.integers(0, 100)))
    state = {
        k: v.detach().double().numpy().copy() for k, v in module.state_dict().items() if k != "num_batches_tracked"
    }
    state["_spatial"] = SPATIAL[spatial_rank]
    return module, state, momentum, eps


def data(spatial_rank: int, seed: int, batched: bool = True, channels: int = 4) -> np.ndarray:
    rng = np.random.default_rng(seed + 1000)
    shape = ((3,) if batched else ()) + (channels,) + SPATIAL[spatial_rank]
    # per-channel offsets and scales far from the running statistics, so pooled and per-instance statistics differ
    x = rng.normal(0, 1, shape) * rng.uniform(0.5, 3, shape[:-spatial_rank] + (1,) * spatial_rank)
    return (x + rng.normal(0, 2, shape[:-spatial_rank] + (1,) * spatial_rank)).astype("float32")


def to_keras(x_cf: np.ndarray, batched: bool) -> np.ndarray:
    return np.moveaxis(x_cf, 1 if batched else 0, -1)


def from_keras(y: np.ndarray, batched: bool) -> np.ndarray:
    return np.moveaxis(np.asarray(y), -1, 1 if batched else 0)


def assert_step(layer, module, x, state, momentum, eps, batched):
    """One training step of the Keras layer against the NumPy oracle and against PyTorch on the same input."""
    y_np, mean_np, var_np = numpy_step(x, state, momentum, eps, batched)
    module.train()
    y_torch = module(torch.tensor(x)).detach().double().numpy()
    y_keras = from_keras(layer(to_keras(x, batched), training=True), batched)
    scale = float(np.max(np.abs(y_np)))
    np.testing.assert_allclose(y_keras, y_np, atol=2e-5 * scale, rtol=1e-5)
    np.testing.assert_allclose(y_torch, y_np, atol=2e-5 * scale, rtol=1e-5)  # the oracle is PyTorch's step
    pairs = ((layer.moving_mean, mean_np, module.running_mean), (layer.moving_variance, var_np, module.running_var))
    for variable, want, theirs in pairs:
        np.testing.assert_allclose(np.asarray(variable.numpy(), np.float64), want, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(theirs.double().numpy(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spatial_rank", [1, 2, 3])
@pytest.mark.parametrize("affine", [True, False])
def test_training_step_and_eval_match_pytorch(spatial_rank, affine):
    module, state, momentum, eps = random_instance_norm(spatial_rank, seed=10 * spatial_rank + affine, affine=affine)
    x = data(spatial_rank, seed=spatial_rank)
    layer, report = converters.convert_with_report(module, "keras")
    assert isinstance(layer, TrackedInstanceNormalization)
    assert report.layers[0].warnings == []
    fates = {t.setting: t.fate for t in report.layers[0].translations}
    assert fates["track_running_stats"] == "exact" and fates["variance_estimator"] == "exact"
    y_eval = from_keras(layer(to_keras(x, True), training=False), True)
    np.testing.assert_allclose(y_eval, numpy_eval(x, state, eps), atol=1e-4, rtol=1e-5)
    assert_step(layer, module, x, state, momentum, eps, batched=True)


@pytest.mark.parametrize("spatial_rank", [1, 2, 3])
@pytest.mark.parametrize("match", [False, True])
def test_inputs_without_a_batch_axis_step_as_pytorch(spatial_rank, match):
    """PyTorch's no_batch_dim input (C, *spatial): one instance; the running variance takes the unbiased estimator."""
    module, state, momentum, eps = random_instance_norm(spatial_rank, seed=40 + spatial_rank)
    x = data(spatial_rank, seed=7 * spatial_rank, batched=False)
    layer, report = converters.convert_with_report(
        module, "keras", input_rank=spatial_rank + 1, match_variance_estimator=match
    )
    assert report.layers[0].warnings == []
    assert {t.setting: t.fate for t in report.layers[0].translations}["no_batch_dim"] == "exact"
    y_eval = from_keras(layer(to_keras(x, False), training=False), False)
    np.testing.assert_allclose(y_eval, numpy_eval(x, state, eps), atol=1e-4, rtol=1e-5)
    assert_step(layer, module, x, state, momentum, eps, batched=False)
    back = converters.to_spec(layer)
    assert (back.spatial_rank, back.input_rank) == (spatial_rank, spatial_rank + 1)


def test_framework_step_and_check_agree():
    """KerasFramework.run_train_step no longer refuses the layer, and converters.check passes its keras leg."""
    module, state, momentum, eps = random_instance_norm(2, seed=3)
    layer = converters.convert(module, "keras")
    x = data(2, seed=5)
    y, mean, var = FRAMEWORK.run_train_step(layer, to_keras(x, True))
    y_np, mean_np, var_np = numpy_step(x, state, momentum, eps, True)
    np.testing.assert_allclose(from_keras(y, True), y_np, atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(var, var_np, atol=1e-5, rtol=1e-5)
    result = converters.check(module, frameworks=["torch", "keras"])
    assert result.passed, result


def test_round_trip_and_keras_file_keep_the_step(tmp_path):
    module, state, momentum, eps = random_instance_norm(3, seed=8)
    spec = converters.to_spec(module)
    layer = converters.convert(module, "keras")
    assert spec_differences(spec, converters.to_spec(layer)) == []
    back = converters.convert(layer, "torch")
    assert isinstance(back, torch.nn.InstanceNorm3d) and back.track_running_stats
    inputs = keras.Input((4, 5, 6, 4))
    model = keras.Model(inputs, layer(inputs))
    path = tmp_path / "tracked.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    restored = loaded.layers[-1]
    assert isinstance(restored, TrackedInstanceNormalization)
    assert (restored.spatial_rank, restored.variance_estimator) == (3, "unbiased")
    x = data(3, seed=9)
    assert_step(restored, module, x, state, momentum, eps, batched=True)


def test_a_biased_source_estimator_is_warned_about_or_matched():
    """A spec whose source folds the biased variance (read from ONNX, or written by hand): PyTorch's unbiased step with
    the usual warning, or with match_variance_estimator=True the biased one, as a BatchNorm's."""
    module, state, momentum, eps = random_instance_norm(2, seed=12)
    spec = converters.to_spec(module).replace(variance_estimator="biased")
    x = data(2, seed=12)
    biased = x.astype(np.float64).var(axis=(2, 3))
    unbiased = biased * 30 / 29  # 5 x 6 spatial elements
    for match, var, warned in ((False, unbiased, True), (True, biased, False)):
        layer = converters.from_spec(spec, "keras", match_variance_estimator=match)
        report = converters.last_report()
        assert any("n/(n-1)" in w or "(n-1)/n" in w for w in report.layers[0].warnings) == warned
        layer(to_keras(x, True), training=True)
        want = (1 - momentum) * state["running_var"] + momentum * var.mean(axis=0)
        np.testing.assert_allclose(np.asarray(layer.moving_variance.numpy(), np.float64), want, atol=1e-5, rtol=1e-5)
        assert converters.to_spec(layer).variance_estimator == ("biased" if match else "unbiased")


def test_cumulative_momentum_is_still_refused():
    module = torch.nn.InstanceNorm2d(3, track_running_stats=True, momentum=None)
    with pytest.raises(NotExpressibleError) as info:
        converters.convert(module, "keras")
    assert info.value.setting == "momentum"


@pytest.mark.slow
def test_normbridge_loads_a_keras_file_holding_the_layer_in_a_fresh_process(tmp_path):
    """The model loader registers the class itself (a fresh process has not imported it), so inspect, port and export
    read such files."""
    import subprocess
    import sys

    module, *_ = random_instance_norm(1, seed=21)
    layer = converters.convert(module, "keras")
    inputs = keras.Input((7, 4))
    path = tmp_path / "tracked1d.keras"
    keras.Model(inputs, layer(inputs)).save(path)
    script = (
        "from pathlib import Path; from converters.keras_adapter import MODEL; import converters; "
        f"m = MODEL.load(Path({str(path)!r})); layer = m.layers[-1]; "
        "print(type(layer).__name__, converters.to_spec(layer).variance_estimator)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["TrackedInstanceNormalization", "unbiased"]
