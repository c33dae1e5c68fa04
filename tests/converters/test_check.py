"""converters.check: passes on faithful adapters, fails (with the reason) on the bugs converters ship."""

from __future__ import annotations

import torch

import converters
from converters.adapters import AdapterRegistry

from tests.spec_factory import make_spec


def buggy_registry() -> AdapterRegistry:
    return AdapterRegistry(
        {"torch": "tests.buggy_torch", "keras": "converters.keras_adapter", "onnx": "converters.onnx_adapter"}
    )


def test_check_of_a_module_passes_and_reports_errors_per_framework():
    bn = torch.nn.BatchNorm2d(4, eps=1e-3, momentum=0.01).eval()
    result = converters.check(bn)
    assert result.passed, result.render_text()
    assert {o.framework for o in result.outputs} == {"torch", "keras", "onnx"}
    assert all(o.max_abs_error < 1e-4 for o in result.outputs)
    assert {s.framework for s in result.training_step} == {"torch", "keras", "onnx"}
    keras_step = next(s for s in result.training_step if s.framework == "keras")
    assert keras_step.expected_var_difference_vs_source > 0  # unbiased vs biased, stated
    assert "PASSED" in result.render_text() and '"passed": true' in result.to_json()


def test_a_train_mode_module_is_not_exported_to_onnx_by_check():
    result = converters.check(torch.nn.BatchNorm2d(4))  # modules start in training mode
    onnx_target = next(t for t in result.targets if t.framework == "onnx")
    assert onnx_target.status == "not_expressible" and "training" in onnx_target.reason
    assert result.passed  # torch and keras hold it; ONNX refusing is the correct outcome


def test_check_catches_a_default_eps_even_where_outputs_barely_move():
    spec = make_spec("layer", eps=1e-3, normalized_shape=(16,), source="torch")
    result = converters.check(spec, frameworks=["torch"], registry=buggy_registry())
    assert not result.passed
    torch_target = result.targets[0]
    assert torch_target.status == "failed"
    assert any(d.startswith("eps") for d in torch_target.spec_differences), result.render_text()


def test_check_catches_an_eps_read_wrong_where_its_writer_agrees():
    """tests/buggy_torch_eps.py reads a float16 RMSNorm(eps=None) as float16's eps and writes it back as eps=None: every
    spec comparison agrees, and only the probe's small sample (variance near eps) shows that torch adds another eps."""
    module = torch.nn.RMSNorm(16).half().eval()
    buggy = AdapterRegistry(
        {"torch": "tests.buggy_torch_eps", "keras": "converters.keras_adapter", "onnx": "converters.onnx_adapter"}
    )
    result = converters.check(module, frameworks=["torch"], registry=buggy)
    assert not result.passed
    torch_output = next(o for o in result.outputs if o.framework == "torch")
    assert not torch_output.passed and torch_output.max_abs_error > 0.1, result.render_text()
    assert converters.check(module, frameworks=["torch"]).passed  # the real adapter reads the eps torch adds


def test_check_catches_dropped_running_statistics():
    spec = make_spec("batch", source="torch")
    result = converters.check(spec, frameworks=["torch"], registry=buggy_registry())
    assert not result.passed
    text = result.render_text()
    assert "tensors.running_mean" in text and "MISMATCH" in text


def test_not_expressible_targets_are_listed_not_failed():
    spec = make_spec("batch", momentum=None, source="torch")
    result = converters.check(spec)
    assert result.passed, result.render_text()
    reasons = {t.framework: t.reason for t in result.targets if t.status == "not_expressible"}
    assert set(reasons) == {"keras", "onnx"} and all("momentum" in r for r in reasons.values())


def test_a_keras_channels_first_layer_checks_against_every_framework():
    import keras
    import numpy as np

    layer = keras.layers.BatchNormalization(axis=1, epsilon=2e-5, momentum=0.95, name="cf_bn")
    layer.build((None, 4, 5, 5))
    layer.moving_variance.assign(np.linspace(0.5, 2.0, 4).astype("float32"))
    spec = converters.to_spec(layer)
    assert spec.layout == "channels_first" and spec.momentum == 0.95 and spec.momentum_convention == "running_weight"
    result = converters.check(layer)
    assert result.passed, result.render_text()
    assert converters.convert(layer, "torch").momentum == 0.05
