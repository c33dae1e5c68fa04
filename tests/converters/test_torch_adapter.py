"""PyTorch specifics: RMSNorm eps=None, frozen identities, mode, counters, unsupported modules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import converters
from schemas import UnsupportedObjectError

from tests.harness import assert_matches_reference


def test_rms_eps_none_is_stored_as_its_number_and_restored_as_none():
    module = torch.nn.RMSNorm([4, 3])
    spec = converters.to_spec(module)
    assert spec.eps == float(torch.finfo(torch.float32).eps) and spec.eps_origin == "dtype_eps"
    assert converters.from_spec(spec, "torch").eps is None
    assert_matches_reference(module, spec)


def test_non_default_settings_and_mode_are_read():
    module = torch.nn.BatchNorm3d(4, eps=1e-3, momentum=0.01, affine=True, bias=False).train()
    spec = converters.to_spec(module)
    assert (spec.eps, spec.momentum, spec.momentum_convention) == (1e-3, 0.01, "batch_weight")
    assert spec.spatial_rank == 3 and spec.training and spec.scale and not spec.bias
    assert spec.variance_estimator == "unbiased" and "num_batches_tracked" in spec.tensors


def test_bias_without_weight_becomes_a_frozen_identity_and_reads_back_absent():
    spec = converters.to_spec(torch.nn.GroupNorm(2, 4))
    spec = spec.replace(scale=False, tensors={"bias": spec.tensors["bias"] + 0.5})
    module = converters.from_spec(spec, "torch")
    assert not module.weight.requires_grad and torch.all(module.weight == 1)
    assert any(t.setting == "scale" and t.fate == "stored" for t in converters.last_report().layers[0].translations)
    assert converters.to_spec(module) == spec
    with torch.no_grad():
        module.weight.mul_(2)  # someone changed it: it is a real scale now, and we say so
    assert converters.to_spec(module).scale is True
    assert converters.last_report().layers[0].warnings


def test_state_is_bit_identical_after_round_trip():
    module = torch.nn.BatchNorm2d(6)
    with torch.no_grad():
        module.running_mean.copy_(torch.randn(6))
        module.running_var.copy_(torch.rand(6) + 0.1)
        module.weight.copy_(torch.randn(6))
    back = converters.convert(module, "torch")
    for name, tensor in module.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


# SyncBatchNorm is read as the BatchNorm it computes at eval (tests/converters/test_torch_recognition.py),
# with a hazard.
@pytest.mark.parametrize("module", [torch.nn.Linear(3, 3), torch.nn.LazyBatchNorm2d()])
def test_unsupported_modules_are_refused_with_the_class_name(module):
    with pytest.raises(UnsupportedObjectError) as info:
        converters.to_spec(module)
    assert type(module).__name__ in str(info.value)


def test_bfloat16_converts_and_a_dtype_torch_norms_lack_is_refused_naming_dtype():
    from schemas import SpecError

    assert converters.to_spec(torch.nn.LayerNorm(4).to(torch.bfloat16)).dtype == "bfloat16"
    with pytest.raises(SpecError, match="dtype"):
        converters.to_spec(torch.nn.LayerNorm(4).to(torch.float8_e4m3fn))


def test_user_subclass_of_a_torch_norm_is_recognised():
    class MyNorm(torch.nn.LayerNorm):
        pass

    spec = converters.to_spec(MyNorm(5, eps=3e-4))
    assert spec.kind == "layer" and spec.eps == 3e-4


def test_float16_batchnorm_matches_reference():
    module = torch.nn.BatchNorm1d(3, eps=1e-3).to(torch.float16).eval()
    spec = converters.to_spec(module)
    assert spec.dtype == "float16"
    assert_matches_reference(module, spec)
    assert np.all(spec.tensors["running_var"] == 1)


# torch computes a 16-bit RMSNorm in float32 and, given eps=None, adds float32's eps, not the layer dtype's
# (torch._decomp's _fused_rms_norm); the literal eps values below are NumPy's, not the code's.
TORCH_DEFAULT_EPS = {
    "float16": np.finfo(np.float32).eps,
    "bfloat16": np.finfo(np.float32).eps,
    "float32": np.finfo(np.float32).eps,
    "float64": np.finfo(np.float64).eps,
}


@pytest.mark.parametrize("dtype", sorted(TORCH_DEFAULT_EPS))
def test_rms_eps_none_is_the_eps_torch_adds_in_every_dtype_and_every_framework_computes_with_it(dtype):
    """Small activations (mean square 1e-4) make eps matter: float16's own eps
    (9.8e-4) would move the output by ~70%."""
    torch_dtype = getattr(torch, dtype)
    module = torch.nn.RMSNorm(8).to(torch_dtype).eval()
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(np.linspace(0.5, 1.5, 8)))
    weight = module.weight.detach().double().numpy()  # as the layer's dtype holds it
    spec = converters.to_spec(module)
    assert spec.eps == float(TORCH_DEFAULT_EPS[dtype]) and spec.eps_origin == "dtype_eps"
    x = (torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(0)) * 1e-2).to(torch_dtype)
    x64 = x.double().numpy()
    expected = x64 / np.sqrt(np.mean(x64**2, axis=-1, keepdims=True) + TORCH_DEFAULT_EPS[dtype]) * weight
    with torch.no_grad():
        source = module(x).double().numpy()
    bound = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 1e-5, "float64": 1e-12}[dtype]  # a few ulps of the output
    np.testing.assert_allclose(source, expected, atol=bound, rtol=bound, err_msg="torch's own eps=None")
    assert converters.from_spec(spec, "torch").eps is None
    layer = converters.from_spec(spec, "keras")
    np.testing.assert_allclose(
        np.asarray(layer(x.float().numpy().astype(layer.dtype))).astype(np.float64),
        expected,
        atol=bound,
        rtol=bound,
        err_msg="keras",
    )
    if dtype != "bfloat16":  # onnxruntime's CPU provider has no bfloat16 normalization kernels
        import onnxruntime as ort

        session = ort.InferenceSession(
            converters.from_spec(spec, "onnx").SerializeToString(), providers=["CPUExecutionProvider"]
        )
        out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        np.testing.assert_allclose(out.astype(np.float64), expected, atol=bound, rtol=bound, err_msg="onnx")
    assert converters.check(module).passed


def test_a_stateless_module_has_no_dtype_of_its_own_and_the_report_says_which_it_was_read_as():
    """LayerNorm(elementwise_affine=False).double() holds no tensor: its spec takes torch's default dtype, and the
    report says so (a converted ONNX graph takes float32 inputs, which a float64 caller would meet as a refusal of its
    input)."""
    stateless = torch.nn.LayerNorm(8, elementwise_affine=False).double()
    spec = converters.to_spec(stateless)
    assert spec.dtype == "float32"
    [warning] = [w for w in converters.last_report().layers[0].warnings if "no dtype of its own" in w]
    assert "float32" in warning and "spec.replace(dtype=" in warning
    converters.to_spec(torch.nn.LayerNorm(8).double())
    assert not [w for w in converters.last_report().layers[0].warnings if "no dtype of its own" in w]
