"""Keras 3 adapter: what it refuses and what it reads exactly at the edges (renorm, rms_scaling, unbuilt layers,
untracked and tracked instance-style BatchNorms, half and bfloat16 dtypes, unsupported policies and axes).

Real Keras on the TensorFlow backend, no mocks; errors must name the layer and the setting. The conversions of every
kind, round trips and Keras-built layers are in tests/converters/test_keras_adapter.py.
"""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from converters import api, reference  # noqa: E402
from converters.keras_adapter import FRAMEWORK, KIND_ADAPTERS  # noqa: E402
from converters.options import ConversionOptions  # noqa: E402
from converters.probe import probe_input  # noqa: E402
from schemas import LayerReport, NormSpec, NotExpressibleError, SpecError, UnsupportedObjectError, spec_differences  # noqa: E402
from schemas.tensors import tensors_identical  # noqa: E402

from tests.converters.test_keras_adapter import (
    CASES,
    NBT,
    assert_close,
    assert_names,
    keras_input,
    keras_output,
    make_spec,
)  # noqa: E402


def test_renorm_is_not_expressible():
    layer = keras.layers.BatchNormalization(renorm=True, name="bn_renorm")
    layer.build((None, 3))
    with pytest.raises(NotExpressibleError) as info:
        api.to_spec(layer)
    assert_names(info.value, "bn_renorm", "renorm")
    assert info.value.target == "NormSpec" and "PyTorch or ONNX" in str(info.value)


def test_rms_scaling_layernorm_is_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = keras.layers.LayerNormalization(rms_scaling=True, name="ln_rms")
    layer.build((None, 4))
    with pytest.raises(SpecError) as info:
        api.to_spec(layer)
    assert_names(info.value, "ln_rms", "rms_scaling")


@pytest.mark.parametrize(
    "factory",
    [
        keras.layers.BatchNormalization,
        keras.layers.LayerNormalization,
        keras.layers.RMSNormalization,
        keras.layers.GroupNormalization,
    ],
)
def test_unbuilt_layer_is_refused(factory):
    layer = factory(name="unbuilt")
    with pytest.raises(SpecError) as info:
        api.to_spec(layer)
    assert_names(info.value, "unbuilt", "input_shape")
    assert "build(input_shape)" in str(info.value)


def test_untracked_batch_is_not_expressible():
    spec = make_spec("batch", eps=1e-5, track_running_stats=False)
    with pytest.raises(NotExpressibleError) as info:
        api.from_spec(spec, "keras")
    assert_names(info.value, "batch_norm", "track_running_stats")
    assert info.value.target == "keras"


def test_tracked_instance_converts_to_tracked_instance_normalization_exact_in_eval():
    """Eval and the round trip here; the training step against a NumPy oracle:
    tests/converters/test_instance_tracked_keras.py."""
    from converters.keras_adapter.tracked_instance_normalization import TrackedInstanceNormalization

    rng = np.random.default_rng(4)
    tracked = {
        "running_mean": rng.normal(size=3).astype("float32"),
        "running_var": rng.uniform(0.5, 2, 3).astype("float32"),
    }
    spec = make_spec(
        "instance",
        eps=1e-5,
        momentum=0.1,
        momentum_convention="batch_weight",
        variance_estimator="unbiased",
        track_running_stats=True,
        extra_tensors=tracked,
    )
    layer, report = api.convert_with_report(api.from_spec(spec, "torch"), "keras")
    assert isinstance(layer, TrackedInstanceNormalization)
    assert report.layers[0].warnings == []
    back = api.to_spec(layer)
    assert back.kind == "instance" and spec_differences(spec, back) == []
    assert all(tensors_identical(back.tensors[n], spec.tensors[n]) for n in tracked)
    x = probe_input(spec)
    assert_close(spec, keras_output(spec, FRAMEWORK.run_eval(layer, keras_input(spec, x))), reference.forward(spec, x))


def test_tracked_instance_with_a_cumulative_average_is_still_refused():
    spec = make_spec(
        "instance",
        eps=1e-5,
        momentum=None,
        track_running_stats=True,
        variance_estimator="unbiased",
        extra_tensors={"running_mean": np.zeros(3, "float32"), "running_var": np.ones(3, "float32"), **NBT},
    )
    with pytest.raises(NotExpressibleError) as info:
        api.from_spec(spec, "keras")
    assert_names(info.value, "instance_norm", "momentum")


def test_bfloat16_keras_layer_reads_bit_exactly():
    """Spec version 2 holds bfloat16: a bf16 Keras BatchNormalization converts, its variables copied bit for bit."""
    layer = keras.layers.BatchNormalization(dtype="bfloat16", name="bn_bf16")
    layer.build((None, 3))
    layer.moving_variance.assign(np.array([0.5, 2.0, 3.25], dtype="float32"))
    spec = api.to_spec(layer)
    assert spec.dtype == "bfloat16"
    stored = spec.tensors["running_var"]
    assert str(stored.dtype) == "bfloat16"
    assert stored.tobytes() == np.asarray(layer.moving_variance.numpy()).tobytes()
    assert stored.astype("float32").tolist() == [0.5, 2.0, 3.25]


@pytest.mark.parametrize(
    "dtype, spec_dtype, compute_dtype",
    [
        ("bfloat16", "bfloat16", None),
        ("mixed_float16", "float16", "float32"),
        ("mixed_bfloat16", "bfloat16", "float32"),
    ],
)
def test_keras_half_dtypes_convert_bit_exactly(dtype, spec_dtype, compute_dtype):
    layer = keras.layers.BatchNormalization(dtype=dtype, name="bn_dtype")
    layer.build((None, 3))
    rng = np.random.default_rng(2)
    for variable in layer.weights:  # distinct values that are exactly `spec_dtype` numbers, in the variables' own dtype
        variable.assign(rng.uniform(0.5, 2.0, 3).astype(spec_dtype).astype(str(variable.dtype)))
    spec = api.to_spec(layer)
    assert (spec.dtype, spec.compute_dtype) == (spec_dtype, compute_dtype)
    for name, attribute in (
        ("scale", "gamma"),
        ("bias", "beta"),
        ("running_mean", "moving_mean"),
        ("running_var", "moving_variance"),
    ):
        assert tensors_identical(
            spec.tensors[name].astype(str(layer.variable_dtype)), getattr(layer, attribute).numpy()
        )
    back = api.from_spec(spec, "keras")
    assert back.dtype_policy.name == dtype and spec_differences(spec, api.to_spec(back)) == []


def test_a_mixed_policy_state_no_bfloat16_holds_is_read_as_float32_state_not_refused():
    layer = keras.layers.BatchNormalization(dtype=keras.DTypePolicy("mixed_bfloat16"), name="bn_dtype")
    layer.build((None, 3))
    layer.gamma.assign(
        np.full(3, 1.0 + 2.0**-12, "float32")
    )  # a float32 state no bfloat16 tensor holds (a trained layer)
    spec = api.to_spec(layer)
    assert (spec.dtype, spec.compute_dtype, spec.state_dtype) == ("bfloat16", "float32", "float32")
    assert spec.tensors["scale"].dtype == np.float32 and float(spec.tensors["scale"][0]) == 1.0 + 2.0**-12


def test_unsupported_spec_dtype():
    good = CASES["layer_2axes"]()
    bad = NormSpec.model_construct(**{**{f: getattr(good, f) for f in type(good).model_fields}, "dtype": "int8"})
    report = LayerReport(layer=bad.name, kind="layer", source_framework="spec", target_framework="keras", target_op="?")
    with pytest.raises(SpecError) as info:
        KIND_ADAPTERS["layer"]().from_spec(bad, ConversionOptions(), report)
    assert_names(info.value, "layer_norm", "dtype")


def test_non_channel_axes_are_refused():
    bn = keras.layers.BatchNormalization(axis=2, name="bn_axis")
    bn.build((None, 3, 4, 5))
    with pytest.raises(UnsupportedObjectError) as info:
        api.to_spec(bn)
    assert_names(info.value, "bn_axis", "axis")
    ln = keras.layers.LayerNormalization(axis=[1, 3], name="ln_axis")
    ln.build((None, 3, 4, 5))
    with pytest.raises(UnsupportedObjectError) as info:
        api.to_spec(ln)
    assert_names(info.value, "ln_axis", "axis")
