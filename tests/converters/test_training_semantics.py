"""One training step after conversion: identical statistics, or exactly the difference the report states."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import converters
from converters import REGISTRY, reference
from converters.layout import from_channels_first
from converters.probe import probe_input

from tests.spec_factory import make_spec


def step(obj, spec_cf_input):
    """(running_mean, running_var) after one training step of `obj` on channels-first input."""
    obj_spec = converters.to_spec(obj)
    framework = REGISTRY.framework_of(obj)
    _, mean, var = framework.run_train_step(obj, from_channels_first(spec_cf_input, obj_spec.layout))
    return np.asarray(mean, np.float64), np.asarray(var, np.float64)


def trained_torch_bn(momentum=0.1):
    torch.manual_seed(1)
    bn = torch.nn.BatchNorm2d(5, eps=1e-3, momentum=momentum)
    bn.train()
    for _ in range(3):
        bn(torch.randn(8, 5, 4, 4) * 2 + 1)
    return bn.eval()


@pytest.mark.parametrize("target", ["keras", "onnx"])
def test_torch_to_biased_target_reports_the_estimator_gap_and_it_is_what_happens(target):
    bn = trained_torch_bn()
    spec = converters.to_spec(bn)
    converted, report = converters.convert_with_report(bn, target)
    warning = " ".join(report.layers[0].warnings)
    assert "unbiased" in warning and "n/(n-1)" in warning or "(n-1)/n" in warning
    x = probe_input(spec)
    torch_mean, torch_var = step(bn, x)
    target_mean, target_var = step(converted, x)
    np.testing.assert_allclose(target_mean, torch_mean, atol=1e-6)
    gap = reference.estimator_gap(spec, x)
    assert gap > 1e-4  # the difference is real ...
    np.testing.assert_allclose(np.max(np.abs(target_var - torch_var)), gap, rtol=1e-3)  # ... and exactly as stated


def test_match_estimator_makes_keras_training_identical_to_torch():
    bn = trained_torch_bn()
    spec = converters.to_spec(bn)
    keras_layer, report = converters.convert_with_report(bn, "keras", match_variance_estimator=True)
    # The one warning left is Keras's NaN on an empty batch (tests/converters/test_dtypes.py), not the estimator.
    assert all("empty batch" in w for w in report.layers[0].warnings)
    assert converters.to_spec(keras_layer).variance_estimator == "unbiased"
    x = probe_input(spec)
    torch_mean, torch_var = step(bn, x)
    keras_mean, keras_var = step(keras_layer, x)
    np.testing.assert_allclose(keras_mean, torch_mean, atol=1e-6)
    np.testing.assert_allclose(keras_var, torch_var, rtol=1e-6, atol=1e-6)


def test_match_estimator_makes_torch_training_identical_to_keras():
    spec = make_spec(
        "batch", momentum=0.99, convention="running_weight", estimator="biased", layout="channels_last", nbt=None
    )
    keras_layer = converters.from_spec(spec, "keras")
    plain = converters.convert(keras_layer, "torch")
    matched = converters.convert(keras_layer, "torch", match_variance_estimator=True)
    assert type(matched).__name__ == "BiasedBatchNorm2d"
    x = probe_input(spec)
    keras_mean, keras_var = step(keras_layer, x)
    matched_mean, matched_var = step(matched, x)
    _, plain_var = step(plain, x)
    np.testing.assert_allclose(matched_mean, keras_mean, atol=1e-6)
    np.testing.assert_allclose(matched_var, keras_var, rtol=1e-6, atol=1e-6)
    assert np.max(np.abs(plain_var - keras_var)) > 1e-5  # without the option they do differ


def test_cumulative_momentum_next_step_matches_torch_for_one_step():
    bn = trained_torch_bn(momentum=None)
    spec = converters.to_spec(bn)
    assert spec.momentum is None and int(spec.tensors["num_batches_tracked"]) == 3
    keras_layer, report = converters.convert_with_report(
        bn, "keras", cumulative_momentum="next_step", match_variance_estimator=True
    )
    assert any("next training step only" in w for w in report.layers[0].warnings)
    x = probe_input(spec)
    torch_mean, torch_var = step(bn, x)
    keras_mean, keras_var = step(keras_layer, x)
    np.testing.assert_allclose(keras_mean, torch_mean, atol=1e-6)
    np.testing.assert_allclose(keras_var, torch_var, rtol=1e-6, atol=1e-6)


def test_torch_biased_subclass_follows_the_biased_reference():
    spec = make_spec("batch", estimator="biased", momentum=0.2)
    module = converters.from_spec(spec, "torch", match_variance_estimator=True)
    x = probe_input(spec)
    mean, var = step(module, x)
    expected = reference.train_step(spec, x, "biased")
    np.testing.assert_allclose(mean, expected.running_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, expected.running_var, rtol=1e-5, atol=1e-6)
    assert int(module.num_batches_tracked) == 7  # the copy trained, the original did not
