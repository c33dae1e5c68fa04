"""bfloat16 and float16 everywhere, compute dtypes, frozen statistics and empty batches (issue 13, items 3, 4, 10, 11).

The reference's rounding rules are proved against the formulas real classes write (LlamaRMSNorm,
GemmaRMSNorm, ConvNeXt's channels_first LayerNorm), spelled out here in torch; every framework's
own behaviour (bf16 modules, Keras mixed policies, empty batches) is run, not assumed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch

import converters
from converters import reference
from converters.adapters import REGISTRY
from converters.model_values import LayerFacts
from converters.models.hazards import eps_underflow, layer_hazards
from converters.probe import probe_input
from converters.torch_adapter.common import numpy_from_tensor, tensor_from_numpy
from registry.tensor_blobs import check_tensor_header, tensor_blob, tensor_from_blob
from schemas import NotExpressibleError, SpecError, load_spec, save_spec, spec_differences
from schemas.manifest import TensorRef
from schemas.tensors import tensors_identical

from tests.spec_factory import make_spec, spec_with

BF16 = ml_dtypes.bfloat16


def _torch(x: np.ndarray) -> torch.Tensor:
    return tensor_from_numpy(np.asarray(x))


def _rms_spec(**extended):
    return make_spec("rms", normalized_shape=(8,), dtype="bfloat16", eps=1e-6, seed=3).replace(**extended)


# -- the reference against the formulas real classes write ------------------------------------


def test_cast_before_affine_is_llama_rms_norm_bit_for_bit():
    spec = _rms_spec(compute_dtype="float32", cast_before_affine=True)
    x = probe_input(spec)
    h = _torch(x).float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + spec.eps)
    llama = _torch(spec.tensors["scale"]) * h.to(torch.bfloat16)  # transformers' LlamaRMSNorm.forward
    np.testing.assert_array_equal(reference.forward(spec, x), llama.float().numpy())
    # ... and it is not what casting after the affine gives: the setting changes outputs.
    assert not np.array_equal(reference.forward(spec.replace(cast_before_affine=False), x), llama.float().numpy())


def test_scale_offset_is_gemma_rms_norm_bit_for_bit():
    spec = _rms_spec(compute_dtype="float32", scale_offset=1.0)
    x = probe_input(spec)
    h = _torch(x).float()
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + spec.eps)
    gemma = (out * (1.0 + _torch(spec.tensors["scale"]).float())).to(torch.bfloat16)  # GemmaRMSNorm.forward
    np.testing.assert_array_equal(reference.forward(spec, x), gemma.float().numpy())


def test_channels_first_layer_norm_is_convnext_s():
    spec = spec_with("layer", normalized_shape=(6,), layout="channels_first", input_rank=4, eps=1e-6)
    x = probe_input(spec)
    assert x.shape[1] == 6 and x.ndim == 4
    t = torch.from_numpy(x).permute(0, 2, 3, 1)
    convnext = torch.nn.functional.layer_norm(
        t, (6,), torch.from_numpy(spec.tensors["scale"]), torch.from_numpy(spec.tensors["bias"]), spec.eps
    )
    np.testing.assert_allclose(reference.forward(spec, x), convnext.permute(0, 3, 1, 2).numpy(), atol=2e-6, rtol=1e-5)


def test_a_frozen_batch_norm_uses_its_statistics_in_training_and_never_moves_them():
    spec = spec_with("batch", eps=1e-5, frozen=True)
    x = probe_input(spec)
    step = reference.train_step(spec, x)
    np.testing.assert_array_equal(step.output, reference.forward(spec, x, training=False))
    np.testing.assert_array_equal(step.running_mean, spec.tensors["running_mean"])
    np.testing.assert_array_equal(step.running_var, spec.tensors["running_var"])


def test_keras_frozen_batch_norm_really_is_frozen():
    spec = spec_with("batch", eps=1e-5, frozen=True)
    layer = converters.from_spec(spec, "keras")
    x = probe_input(spec)
    y, mean, var = REGISTRY.framework("keras").run_train_step(layer, np.moveaxis(x, 1, -1))
    assert tensors_identical(mean, spec.tensors["running_mean"]) and tensors_identical(var, spec.tensors["running_var"])
    np.testing.assert_allclose(np.moveaxis(y, -1, 1), reference.forward(spec, x, training=False), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_a_frozen_stock_layer_names_its_missing_training_step(target):
    spec = spec_with("batch", eps=1e-5, frozen=True)
    obj, report = converters.api.write_spec(spec, target, converters.ConversionOptions())
    if target == "torch":
        assert obj.momentum == 0.0 and any("frozen" in w for w in report.warnings)
    with pytest.raises(NotExpressibleError) as raised:
        REGISTRY.framework(target).run_train_step(obj, probe_input(spec))
    assert raised.value.setting == "frozen"


# -- bfloat16 in each framework --------------------------------------------------------------


def test_torch_bfloat16_modules_convert_bit_exactly_and_compute_in_float32():
    module = torch.nn.LayerNorm(8, eps=1e-5, dtype=torch.bfloat16)
    with torch.no_grad():
        module.weight.copy_(torch.linspace(0.5, 1.5, 8))
        module.bias.copy_(torch.linspace(-1, 1, 8))
    spec = converters.to_spec(module)
    assert spec.dtype == "bfloat16" and spec.tensors["scale"].dtype == BF16
    assert tensors_identical(spec.tensors["scale"], numpy_from_tensor(module.weight.detach()))
    x = probe_input(spec)
    # torch's CPU kernel computes statistics and affine in float32 and rounds once:
    # the reference with compute_dtype float32, exactly.
    np.testing.assert_array_equal(
        REGISTRY.framework("torch").run_eval(module, x).astype(np.float64),
        reference.forward(spec.replace(compute_dtype="float32"), x),
    )


@pytest.mark.parametrize("policy, dtype", [("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")])
def test_a_keras_mixed_policy_reads_as_its_compute_dtype_with_float32_statistics(policy, dtype):
    import keras

    layer = keras.layers.LayerNormalization(dtype=policy, name="ln_mixed", epsilon=1e-5)
    layer.build((None, 8))
    layer.gamma.assign(np.linspace(0.5, 1.5, 8).astype(dtype).astype("float32"))  # state that is exactly `dtype`
    spec = converters.to_spec(layer)
    assert (spec.dtype, spec.compute_dtype) == (dtype, "float32")
    back = converters.from_spec(spec, "keras")
    assert back.dtype_policy.name == policy and spec_differences(spec, converters.to_spec(back)) == []
    x = probe_input(spec)
    np.testing.assert_array_equal(
        REGISTRY.framework("keras").run_eval(layer, x).astype(np.float64), reference.forward(spec, x)
    )


def _trained_mixed_layer(kind: str, policy: str):
    """A built Keras normalization layer under `policy` whose float32 variables hold values no 16-bit float holds
    (trained)."""
    import keras

    layer = {
        "layer": lambda: keras.layers.LayerNormalization(dtype=policy, name="ln_wide", epsilon=1e-5),
        "rms": lambda: keras.layers.RMSNormalization(dtype=policy, name="rms_wide", epsilon=1e-6),
        "batch": lambda: keras.layers.BatchNormalization(dtype=policy, name="bn_wide"),
        "group": lambda: keras.layers.GroupNormalization(groups=2, dtype=policy, name="gn_wide"),
    }[kind]()
    layer.build((None, 3, 8))
    rng = np.random.default_rng(0)
    for variable in layer.weights:
        variable.assign(rng.uniform(0.5, 2.0, tuple(variable.shape)).astype("float32") + np.float32(2.0**-14))
    return layer


@pytest.mark.parametrize("kind", ["layer", "rms", "batch", "group"])
@pytest.mark.parametrize("policy, dtype", [("mixed_float16", "float16"), ("mixed_bfloat16", "bfloat16")])
def test_a_mixed_policy_layer_with_trained_float32_state_reads_as_float32_state_and_computes_what_keras_computes(
    kind, policy, dtype
):
    """Keras's normalization layers cast a mixed layer's float32 variables to float32 and apply them there: a trained
    layer (state no 16-bit float holds) reads with state_dtype float32, the variables bit-exactly (it used to be
    refused); RMSNormalization autocasts its scale to the compute dtype first, so it reads as that rounded scale."""
    layer = _trained_mixed_layer(kind, policy)
    spec = converters.to_spec(layer)
    variables = {v.path.split("/")[-1]: np.asarray(v.numpy()) for v in layer.weights}
    if kind == "rms":  # RMSNormalization autocasts its scale to `dtype` in call: the spec holds what it computes with
        assert (spec.dtype, spec.compute_dtype, spec.state_dtype) == (dtype, "float32", None)
        assert tensors_identical(spec.tensors["scale"], variables["scale"].astype(dtype))
        _compare_with_keras(layer, spec, dtype)
        return
    assert (spec.dtype, spec.compute_dtype, spec.state_dtype) == (dtype, "float32", "float32")
    assert all(a.dtype == np.float32 for a in spec.tensors.values())
    assert tensors_identical(spec.tensors["scale"], variables["gamma"])
    expected = _compare_with_keras(layer, spec, dtype)
    # the float32 state matters: the same layer with its state rounded to `dtype` computes something else
    narrowed = spec.replace(state_dtype=None, tensors={k: v.astype(dtype) for k, v in spec.tensors.items()})
    assert not np.array_equal(reference.forward(narrowed, probe_input(spec)), expected)
    back = converters.from_spec(spec, "keras")
    assert back.dtype_policy.name == policy and spec_differences(spec, converters.to_spec(back)) == []
    for target in ("torch", "onnx"):
        with pytest.raises(NotExpressibleError) as raised:
            converters.from_spec(spec, target)
        assert (
            raised.value.setting in set(spec.extended_settings()) - REGISTRY.get(target, kind).holds
            and raised.value.layer == spec.name
        )


def _compare_with_keras(layer, spec, dtype):
    """The Keras layer's eval output against the NumPy reference of `spec`, to 2 ulps of `dtype`;
    the reference returned."""
    x = probe_input(spec)  # channels first; Keras's channel kinds read channels last
    channels_last = spec.layout == "channels_last"
    got = REGISTRY.framework("keras").run_eval(layer, np.moveaxis(x, 1, -1) if channels_last else x)
    got = np.moveaxis(got, -1, 1) if channels_last else got
    assert got.dtype == np.dtype(dtype)
    ulp = 2.0 ** (-10 if dtype == "float16" else -7)
    expected = reference.forward(spec, x)
    np.testing.assert_allclose(
        got.astype(np.float64), expected, atol=2 * ulp * max(1.0, np.abs(expected).max()), rtol=2 * ulp
    )
    return expected


def test_onnx_writes_bfloat16_tensors_bit_exactly_and_stash_type_for_float32_statistics():
    spec = make_spec("layer", normalized_shape=(8,), dtype="bfloat16", eps=1e-5).replace(compute_dtype="float32")
    model = converters.from_spec(spec, "onnx")
    node = model.graph.node[0]
    assert node.op_type == "LayerNormalization"
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}["stash_type"] == onnx.TensorProto.FLOAT
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
    back = converters.to_spec(model)
    assert spec_differences(spec, back) == [] and tensors_identical(back.tensors["scale"], spec.tensors["scale"])


def test_a_compute_dtype_the_target_does_not_compute_in_is_refused_naming_it():
    spec = make_spec("batch", dtype="float16", eps=1e-3).replace(compute_dtype="float32")
    with pytest.raises(NotExpressibleError) as raised:
        converters.from_spec(spec, "onnx")  # BatchNormalization has no stash_type
    assert raised.value.setting == "compute_dtype" and raised.value.layer == spec.name
    wide = make_spec("layer", dtype="float16", eps=1e-3).replace(compute_dtype="float64")
    for target in ("torch", "keras", "onnx"):
        with pytest.raises(NotExpressibleError) as raised:
            converters.from_spec(wide, target)
        assert raised.value.setting == "compute_dtype"


# -- storage ---------------------------------------------------------------------------------


def test_a_bfloat16_spec_saves_and_loads_bit_exactly(tmp_path):
    spec = make_spec("batch", dtype="bfloat16", seed=5)
    save_spec(spec, tmp_path / "s")
    loaded = load_spec(tmp_path / "s")
    assert loaded == spec
    assert all(tensors_identical(loaded.tensors[n], spec.tensors[n]) for n in spec.tensors)


def test_a_bfloat16_tensor_blob_round_trips_bit_exactly():
    array = np.array([1.0, -0.0, 3.140625, 1e-38, np.inf], dtype=np.float32).astype(BF16)
    blob = tensor_blob(array)
    ref = TensorRef(digest="0" * 64, dtype="bfloat16", shape=[5], nbytes=10, role="scale", layer="norm")
    check_tensor_header(blob, ref, "scale")
    assert tensors_identical(tensor_from_blob(blob, ref, "scale"), array)


# -- hazards ---------------------------------------------------------------------------------


def _facts(spec) -> LayerFacts:
    return LayerFacts(
        path=spec.name, kind=spec.kind, framework="torch", origin="module", layer_type="LayerNorm", spec=spec
    )


@pytest.mark.parametrize(
    "dtype, eps, compute, severity",
    [
        ("float16", 1e-8, None, "warning"),  # float16(1e-8) == 0
        ("float16", 1e-5, None, "info"),  # 1.00136e-05, below float16's smallest normal 6.1e-05
        ("float16", 1e-8, "float32", None),  # the statistics are float32: eps survives
        ("bfloat16", 1e-8, None, None),  # bfloat16 has float32's range
        ("float32", 1e-50, None, "warning"),
    ],
)
def test_an_eps_that_underflows_in_the_compute_dtype_is_a_hazard(dtype, eps, compute, severity):
    spec = make_spec("layer", normalized_shape=(4,), dtype=dtype, eps=eps).replace(compute_dtype=compute)
    hazard = eps_underflow(_facts(spec))
    if severity is None:
        assert hazard is None
        return
    assert hazard.code == "eps_underflow" and hazard.severity == severity and (compute or dtype) in hazard.message
    assert hazard in layer_hazards(_facts(spec))


# -- empty batches ---------------------------------------------------------------------------


def test_a_training_step_on_an_empty_batch_keeps_torch_s_statistics_and_writes_nan_in_keras_and_onnxruntime():
    spec = make_spec("batch")
    kept = {}
    for framework in ("torch", "keras", "onnx"):
        obj, report = converters.api.write_spec(spec, framework, converters.ConversionOptions())
        empty = np.zeros((0, 5, 4, 6) if framework == "keras" else (0, 6, 5, 4), np.float32)
        _, mean, var = REGISTRY.framework(framework).run_train_step(obj, empty)
        kept[framework] = tensors_identical(mean, spec.tensors["running_mean"]) and tensors_identical(
            var, spec.tensors["running_var"]
        )
        if framework != "torch":
            assert np.isnan(mean).all() and np.isnan(var).all()
            assert any("empty batch" in w and "NaN" in w for w in report.warnings)
    assert kept == {"torch": True, "keras": False, "onnx": False}
    checked = converters.check(spec)
    assert all(any("empty batch" in w for w in t.warnings) for t in checked.targets if t.framework != "torch")


def test_a_bfloat16_model_registers_as_an_artifact_bit_exactly(tmp_path):
    from registry.artifact import extract_artifact
    from registry.manifest_io import load_artifact_folder, save_artifact_folder, tensors_from_blobs

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.BatchNorm1d(8)).to(
        torch.bfloat16
    )
    with torch.no_grad():
        model[2].running_var.uniform_(0.5, 2.0)
    model.eval()
    artifact = extract_artifact(model)
    assert {artifact.manifest.tensors[n].dtype for n in ("1.weight", "2.running_var")} == {"bfloat16"}
    loaded = load_artifact_folder(save_artifact_folder(artifact, tmp_path / "art"))
    arrays = tensors_from_blobs(loaded.manifest, loaded.blobs.__getitem__)
    for name, tensor in model.state_dict().items():
        assert tensors_identical(arrays[name], numpy_from_tensor(tensor)), name
    assert loaded.specs == artifact.specs and all(spec.dtype == "bfloat16" for spec in loaded.specs)


@pytest.mark.parametrize("kind, opset", [("instance", 21), ("group", 20), ("batch", 13)])
def test_an_opset_whose_op_takes_no_bfloat16_is_refused_naming_dtype(kind, opset):
    spec = make_spec(kind, dtype="bfloat16", eps=1e-5, momentum=None if kind == "instance" else 0.1)
    with pytest.raises(NotExpressibleError) as raised:
        converters.from_spec(spec, "onnx", opset=opset)
    assert raised.value.setting == "dtype" and f"opset {opset}" in str(raised.value)
    assert converters.to_spec(converters.from_spec(spec, "onnx", opset=opset + 1)).dtype == "bfloat16"
