"""Keras 3 adapter: every kind against the NumPy reference, round trips, Keras-built layers (its refusals and dtype
edges: test_keras_adapter_refusals.py).

Real Keras on the TensorFlow backend, no mocks. Channel-kind data is made channels-first
(the reference's layout) and moved to channels-last for the Keras layers.
"""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from converters import api, markers, reference  # noqa: E402
from converters.keras_adapter import FRAMEWORK, KIND_ADAPTERS  # noqa: E402
from converters.keras_adapter.unbiased_batch_normalization import UnbiasedBatchNormalization  # noqa: E402
from converters.keras_adapter.deferred import open_rank  # noqa: E402
from converters.layout import from_channels_first, to_channels_first  # noqa: E402
from converters.probe import probe_input  # noqa: E402
from schemas import CHANNEL_KINDS, KINDS, NormSpec, NotExpressibleError, UnsupportedObjectError, spec_differences  # noqa: E402
from schemas.tensors import tensors_identical  # noqa: E402

from tests.cases import CASES as ALL_CASES  # noqa: E402
from tests.harness import KERAS_TOLERANCE  # noqa: E402
from tests.spec_factory import spec_with  # noqa: E402

TOLERANCE = KERAS_TOLERANCE
make_spec = spec_with

NBT = {"num_batches_tracked": np.array(7, dtype=np.int64)}

#: Rows of this file's own, which the tests below also build on by name (the shapes they assume).
NAMED = {
    # PyTorch-like: 0.01 batch_weight, unbiased estimator, a counter, left in train mode.
    "batch2d_torchlike": lambda: make_spec(
        "batch",
        eps=2e-5,
        momentum=0.01,
        momentum_convention="batch_weight",
        variance_estimator="unbiased",
        training=True,
        extra_tensors=NBT,
    ),
    "batch1d_rank2_noscale": lambda: make_spec(
        "batch",
        eps=1e-3,
        momentum=0.9,
        momentum_convention="running_weight",
        variance_estimator="biased",
        spatial_rank=1,
        input_rank=2,
        layout="channels_last",
        scale=False,
    ),
    "batch3d_float64_nobias": lambda: make_spec(
        "batch",
        dtype="float64",
        eps=2e-5,
        momentum=0.01,
        momentum_convention="batch_weight",
        variance_estimator="unbiased",
        spatial_rank=3,
        bias=False,
    ),
    "batch2d_float16": lambda: make_spec(
        "batch",
        dtype="float16",
        eps=1e-3,
        momentum=0.1,
        momentum_convention="batch_weight",
        variance_estimator="unbiased",
    ),
    "layer_2axes": lambda: make_spec("layer", eps=1e-3),
    "layer_1axis_float64_scale_only": lambda: make_spec(
        "layer", dtype="float64", eps=2e-5, normalized_shape=(6,), input_rank=3, bias=False
    ),
    "layer_no_affine": lambda: make_spec("layer", eps=2e-5, scale=False, bias=False, normalized_shape=(3, 4, 5)),
    "rms_scale": lambda: make_spec("rms", eps=2e-5, bias=False),
    "rms_no_scale_dtype_eps": lambda: make_spec(
        "rms",
        eps=float(np.finfo(np.float32).eps),
        eps_origin="dtype_eps",
        scale=False,
        bias=False,
        normalized_shape=(2, 5),
    ),
    "group": lambda: make_spec("group", eps=1e-3),
    "group_one_per_channel": lambda: make_spec(
        "group", eps=2e-5, num_features=4, num_groups=4, input_rank=3, layout="channels_last"
    ),
    "group_float64_no_affine": lambda: make_spec(
        "group", dtype="float64", eps=2e-5, num_features=6, num_groups=3, scale=False, bias=False
    ),
    "instance2d_train_mode": lambda: make_spec("instance", eps=2e-5, training=True),
    "instance1d_float16_no_affine": lambda: make_spec(
        "instance", dtype="float16", eps=1e-3, spatial_rank=1, scale=False, bias=False
    ),
    "instance3d_bias_only": lambda: make_spec("instance", eps=1e-3, spatial_rank=3, scale=False),
}
#: What the generic tests below run over: every row of tests/cases.py that Keras holds as its stock layer (not refused,
#: not only expressed), so a new kind or setting there runs here too, and the named rows above.
CASES = {
    **{
        case.id: (lambda case=case: case.spec)
        for case in ALL_CASES
        if not {"keras"} & (case.refused_by | case.expressed_by | case.no_runtime)
    },
    **NAMED,
}


def keras_input(spec: NormSpec, x_cf: np.ndarray) -> np.ndarray:
    """Channels-first probe data in the layout of the (channels-last) Keras layer."""
    return from_channels_first(x_cf, "channels_last") if spec.kind in CHANNEL_KINDS else x_cf


def keras_output(spec: NormSpec, y: np.ndarray) -> np.ndarray:
    return to_channels_first(y, "channels_last") if spec.kind in CHANNEL_KINDS else y


def assert_close(spec, actual, expected):
    np.testing.assert_allclose(actual.astype(np.float64), expected, **TOLERANCE[spec.dtype])


def assert_tensors_identical(a: NormSpec, b: NormSpec):
    assert set(a.tensors) == set(b.tensors)
    for name in a.tensors:
        assert tensors_identical(a.tensors[name], b.tensors[name]), name


def assert_names(error, layer: str, setting: str):
    assert error.layer == layer and error.setting == setting
    assert f"layer '{layer}'" in str(error) and f"setting '{setting}'" in str(error)


def built(layer, shape, seed=0):
    """Build a Keras layer and give every variable distinct, positive-where-needed values."""
    layer.build(shape)
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        values = (
            rng.uniform(0.5, 2.0, variable.shape)
            if "variance" in variable.path
            else rng.standard_normal(variable.shape)
        )
        variable.assign(values.astype(variable.dtype))
    return layer


# -- spec -> keras -> spec ----------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_eval_matches_reference(case):
    spec = CASES[case]()
    layer = api.from_spec(spec, "keras")
    x_cf = probe_input(spec)
    y = FRAMEWORK.run_eval(layer, keras_input(spec, x_cf))
    assert y.dtype == np.dtype(spec.dtype)
    assert_close(spec, keras_output(spec, y), reference.forward(spec, x_cf, training=False))


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_is_exact(case):
    spec = CASES[case]()
    layer = api.from_spec(spec, "keras")
    back = api.to_spec(layer)
    assert spec_differences(spec, back) == []
    assert_tensors_identical(spec, back)
    assert isinstance(back.eps, float) and back.eps == spec.eps
    assert back.momentum == spec.momentum and back.momentum_convention == spec.momentum_convention
    assert back.source.framework == "keras" and back.source.framework_version == keras.__version__
    assert back.source.layer_type == type(layer).__name__
    assert FRAMEWORK.kind_of(layer) == back.kind == spec.kind


@pytest.mark.parametrize("case", sorted(CASES))
def test_emitted_layer_is_natural_and_reported(case):
    spec = CASES[case]()
    layer = api.from_spec(spec, "keras")
    report = api.last_report().layers[0]
    # A GroupNorm (any rank) or a BatchNorm1d ((N, C) or (N, C, L)) with no recorded rank is built on its first call.
    policy = (
        f"mixed_{spec.dtype}" if spec.compute_dtype not in (None, spec.dtype) else spec.dtype
    )  # statistics in float32
    assert layer.built is not open_rank(spec) and layer.name == spec.name and layer.dtype_policy.name == policy
    assert report.target_op == type(layer).__name__ and report.native
    fates = {t.setting: t for t in report.translations}
    assert fates["eps"].target_value == spec.eps
    assert fates["training"].fate == "stored" and "training=" in fates["training"].note
    if spec.kind in CHANNEL_KINDS:
        assert layer.axis == -1
    if "num_batches_tracked" in spec.tensors:
        assert fates["num_batches_tracked"].fate == "stored" and ".keras" in fates["num_batches_tracked"].note


def test_batch_emits_keras_momentum_convention():
    layer = api.from_spec(CASES["batch2d_torchlike"](), "keras")
    assert layer.momentum == 0.99 and layer.epsilon == 2e-5  # 0.01 batch_weight, complemented on the decimal
    assert type(layer) is keras.layers.BatchNormalization  # estimator differs but matching was not asked for
    report = api.last_report().layers[0]
    assert {t.setting: t.fate for t in report.translations}["variance_estimator"] == "approximate"
    assert any("running_var" in w for w in report.warnings)


def test_cumulative_momentum_needs_an_option():
    spec = make_spec(
        "batch",
        eps=1e-5,
        momentum=None,
        variance_estimator="unbiased",
        extra_tensors={"num_batches_tracked": np.array(3, dtype=np.int64)},
    )
    with pytest.raises(NotExpressibleError) as info:
        api.from_spec(spec, "keras")
    assert_names(info.value, "batch_norm", "momentum")
    layer = api.from_spec(spec, "keras", cumulative_momentum="next_step")
    assert layer.momentum == 0.75  # 1 - 1/(3+1)
    back = api.to_spec(layer)  # the marker agrees with the layer: momentum None comes back
    assert back.momentum is None and int(back.tensors["num_batches_tracked"]) == 3


# -- training steps -----------------------------------------------------------------


def test_unbiased_training_step_matches_reference():
    spec = CASES["batch2d_torchlike"]()
    layer = api.from_spec(spec, "keras", match_variance_estimator=True)
    assert isinstance(layer, UnbiasedBatchNormalization)
    x_cf = probe_input(spec)
    before = np.array(layer.moving_variance.numpy())
    y, mean, var = FRAMEWORK.run_train_step(layer, keras_input(spec, x_cf))
    expected = reference.train_step(spec, x_cf, "unbiased")
    assert_close(spec, keras_output(spec, y), expected.output)
    np.testing.assert_allclose(mean, expected.running_mean, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(var, expected.running_var, atol=1e-6, rtol=1e-5)
    biased = reference.train_step(spec, x_cf, "biased").running_var
    assert np.max(np.abs(var - biased)) > 1e-5  # the test can tell the estimators apart
    assert tensors_identical(before, layer.moving_variance.numpy())  # run on a copy
    assert api.to_spec(layer).variance_estimator == "unbiased"


@pytest.mark.parametrize("case", ["batch2d_torchlike", "batch1d_rank2_noscale", "batch3d_float64_nobias"])
def test_keras_training_step_uses_biased_variance(case):
    spec = CASES[case]()
    layer = api.from_spec(spec, "keras")
    x_cf = probe_input(spec)
    y, mean, var = FRAMEWORK.run_train_step(layer, keras_input(spec, x_cf))
    expected = reference.train_step(spec, x_cf, "biased")
    assert_close(spec, keras_output(spec, y), expected.output)
    np.testing.assert_allclose(mean, expected.running_mean, **TOLERANCE[spec.dtype])
    np.testing.assert_allclose(var, expected.running_var, **TOLERANCE[spec.dtype])


def test_unbiased_layer_serialises_and_defers_at_inference():
    layer = api.from_spec(CASES["batch2d_torchlike"](), "keras", match_variance_estimator=True)
    config = keras.layers.serialize(layer)
    assert config["registered_name"] == "normbridge>UnbiasedBatchNormalization"
    assert type(keras.layers.deserialize(config)) is UnbiasedBatchNormalization
    x = np.random.default_rng(5).standard_normal((2, 5, 4, 3)).astype("float32")
    plain = keras.layers.BatchNormalization.from_config(layer.get_config())
    plain.build(x.shape)
    plain.set_weights(layer.get_weights())
    np.testing.assert_array_equal(layer(x, training=False).numpy(), plain(x, training=False).numpy())


def test_frozen_batchnorm_reads_as_inference_mode():
    layer = api.from_spec(CASES["batch2d_torchlike"](), "keras")  # training=True remembered
    layer.trainable = False
    spec = api.to_spec(layer)
    assert spec.training is False
    assert any("trainable=False" in w for w in api.last_report().warnings)
    x = np.random.default_rng(6).standard_normal((2, 5, 4, 3)).astype("float32")
    y, mean, _ = FRAMEWORK.run_train_step(layer, x)  # Keras: frozen BN runs in inference mode
    np.testing.assert_allclose(y, FRAMEWORK.run_eval(layer, x), atol=1e-6)
    assert tensors_identical(mean, spec.tensors["running_mean"])


# -- Keras-built layers -------------------------------------------------------------


def test_keras_batchnorm_channels_first():
    layer = built(keras.layers.BatchNormalization(axis=1, momentum=0.9, name="bn_cf"), (None, 3, 5, 4))
    spec = api.to_spec(layer)
    assert (spec.kind, spec.layout, spec.spatial_rank, spec.input_rank, spec.num_features) == (
        "batch",
        "channels_first",
        2,
        4,
        3,
    )
    assert spec.eps == 1e-3 and spec.momentum == 0.9 and spec.momentum_convention == "running_weight"
    assert spec.variance_estimator == "biased" and spec.track_running_stats and spec.training is False
    assert tensors_identical(spec.tensors["running_var"], layer.moving_variance.numpy())
    x = probe_input(spec)
    assert_close(spec, FRAMEWORK.run_eval(layer, x), reference.forward(spec, x))
    y, mean, var = FRAMEWORK.run_train_step(layer, x)
    expected = reference.train_step(spec, x)
    np.testing.assert_allclose(var, expected.running_var, atol=1e-6, rtol=1e-5)
    assert_close(spec, y, expected.output)


def test_keras_batchnorm_defaults_and_rank2():
    layer = built(keras.layers.BatchNormalization(center=False), (None, 7))
    spec = api.to_spec(layer)
    assert spec.eps == 1e-3 and spec.momentum == 0.99 and spec.bias is False and "bias" not in spec.tensors
    assert (spec.layout, spec.spatial_rank, spec.input_rank) == ("channels_last", 1, 2)


def test_keras_multi_axis_layernorm():
    layer = built(keras.layers.LayerNormalization(axis=[2, 3], epsilon=2e-5), (None, 3, 4, 5))
    spec = api.to_spec(layer)
    assert (spec.kind, spec.normalized_shape, spec.input_rank, spec.eps) == ("layer", (4, 5), 4, 2e-5)
    x = probe_input(spec)
    assert_close(spec, FRAMEWORK.run_eval(layer, x), reference.forward(spec, x))


def test_keras_groupnorm_groups_minus_one_is_instance():
    layer = built(keras.layers.GroupNormalization(groups=-1, epsilon=2e-5), (None, 5, 4, 3))
    assert layer.groups == 3  # build() overwrote -1
    assert FRAMEWORK.kind_of(layer) == "instance"
    spec = api.to_spec(layer)
    assert (spec.kind, spec.num_features, spec.spatial_rank, spec.layout, spec.track_running_stats) == (
        "instance",
        3,
        2,
        "channels_last",
        False,
    )
    x = probe_input(spec)
    y = FRAMEWORK.run_eval(layer, from_channels_first(x, "channels_last"))
    assert_close(spec, to_channels_first(y, "channels_last"), reference.forward(spec, x))


def test_keras_groupnorm_channels_first_and_rank2():
    layer = built(keras.layers.GroupNormalization(groups=2, axis=1), (None, 6, 5))
    spec = api.to_spec(layer)
    assert (spec.kind, spec.num_groups, spec.num_features, spec.layout) == ("group", 2, 6, "channels_first")
    x = probe_input(spec)
    assert_close(spec, FRAMEWORK.run_eval(layer, x), reference.forward(spec, x))
    flat = built(keras.layers.GroupNormalization(groups=-1), (None, 4))  # no spatial axes: not an InstanceNorm
    assert FRAMEWORK.kind_of(flat) == api.to_spec(flat).kind == "group"


def test_keras_rmsnorm():
    layer = built(keras.layers.RMSNormalization(), (None, 3, 8))
    spec = api.to_spec(layer)
    assert (spec.kind, spec.normalized_shape, spec.eps, spec.scale, spec.bias) == ("rms", (8,), 1e-6, True, False)
    x = probe_input(spec)
    assert_close(spec, FRAMEWORK.run_eval(layer, x), reference.forward(spec, x))


@pytest.mark.parametrize(
    "factory, shape",
    [
        (lambda: keras.layers.BatchNormalization(), (None, 4, 3)),
        (lambda: keras.layers.LayerNormalization(), (None, 4)),
        (lambda: keras.layers.RMSNormalization(axis=[-2, -1]), (None, 2, 4)),
        (lambda: keras.layers.GroupNormalization(groups=2), (None, 5, 4)),
        (lambda: keras.layers.GroupNormalization(groups=-1), (None, 5, 4)),
        (lambda: UnbiasedBatchNormalization(), (None, 4)),
    ],
)
def test_kind_of_agrees_with_to_spec(factory, shape):
    layer = built(factory(), shape)
    assert FRAMEWORK.owns(layer)
    assert FRAMEWORK.kind_of(layer) == api.to_spec(layer).kind


# -- markers -------------------------------------------------------------------------


def test_marker_momentum_ignored_when_layer_changed():
    layer = api.from_spec(CASES["batch2d_torchlike"](), "keras")
    layer.momentum = 0.5
    spec = api.to_spec(layer)
    assert (spec.momentum, spec.momentum_convention) == (0.5, "running_weight")
    assert any("momentum" in w for w in api.last_report().warnings)


def test_marker_frozen_scale_trusted_only_while_unchanged():
    spec = CASES["rms_no_scale_dtype_eps"]()
    layer = api.from_spec(spec, "keras")
    assert not layer.trainable and np.all(layer.scale.numpy() == 1)
    assert {t.setting: t.fate for t in api.last_report().layers[0].translations}["scale"] == "stored"
    layer.scale.assign(np.full((2, 5), 2.0, dtype="float32"))
    back = api.to_spec(layer)
    assert back.scale is True and "scale" in back.tensors
    assert any("frozen ones" in w for w in api.last_report().warnings)


def test_marker_eps_origin_and_kind_checked_against_layer():
    layer = api.from_spec(CASES["rms_no_scale_dtype_eps"](), "keras")
    layer.epsilon = 1e-5
    assert api.to_spec(layer).eps_origin == "explicit"
    group = api.from_spec(CASES["group_one_per_channel"](), "keras")
    assert markers.recall(group)["kind"] == "group"
    markers.remember(group, kind=None)
    assert FRAMEWORK.kind_of(group) == api.to_spec(group).kind == "instance"


def test_name_with_slash_round_trips():
    spec = CASES["layer_2axes"]().replace(name="/encoder/ln")
    layer = api.from_spec(spec, "keras")
    assert layer.name == "_encoder_ln"
    assert api.to_spec(layer).name == "/encoder/ln"


# -- framework -----------------------------------------------------------------------


def test_framework_basics():
    assert set(KIND_ADAPTERS) == set(KINDS)
    assert all(cls.framework == "keras" and cls.kind == kind for kind, cls in KIND_ADAPTERS.items())
    assert FRAMEWORK.name == "keras" and FRAMEWORK.natural_layout() == "channels_last"
    assert FRAMEWORK.version() == keras.__version__
    assert not FRAMEWORK.owns(np.zeros(3)) and not FRAMEWORK.owns(object())
    with pytest.raises(UnsupportedObjectError):
        FRAMEWORK.kind_of(keras.layers.Dense(3))


@pytest.mark.slow
def test_owns_does_not_import_keras():
    code = (
        "import sys; from converters.keras_adapter import FRAMEWORK; "
        "assert FRAMEWORK.owns(object()) is False; assert 'keras' not in sys.modules, 'keras imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_run_eval_leaves_state_alone():
    layer = api.from_spec(CASES["batch2d_torchlike"](), "keras")
    before = [np.array(w) for w in layer.get_weights()]
    x = np.random.default_rng(3).standard_normal((2, 5, 4, 3))
    FRAMEWORK.run_eval(layer, x)
    FRAMEWORK.run_train_step(layer, x)
    assert all(tensors_identical(a, b) for a, b in zip(before, layer.get_weights()))
