"""Keras's own normalization layer test configurations, read, converted to every framework and back,
at their input rank.

The rows are the parameterised configurations of
keras/src/layers/normalization/{batch,group,layer,rms}_normalization_test.py (Keras 3): constructor arguments and input
shapes, BatchNormalization's `test_correctness` product (axis x input shape x moving statistics initialisers) included.
Each layer, built for its shape with a random affine state, must equal the NumPy reference of the spec read from it; the
spec converted to torch and ONNX must compute the same on that input; and converted back to Keras with no input rank
recorded, the layer takes the configuration's rank on its first call (a BatchNorm over (N, C) or (N, C, L) and a
GroupNorm are left unbuilt until then), with its state bit-exact.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import converters  # noqa: E402
from converters import REGISTRY, from_spec, last_report, reference, to_spec  # noqa: E402
from converters.equivalence import output_tolerances  # noqa: E402
from converters.layout import from_channels_first, to_channels_first  # noqa: E402
from schemas import SpecError  # noqa: E402
from schemas.kinds import KIND_INFO  # noqa: E402

layers = keras.layers


def _bn_correctness():
    """batch_normalization_test.py test_correctness: parameterized.product over these four."""
    rows = []
    for axis, shape, mean_init, var_init in itertools.product(
        (-1, 1), ((5, 2, 3), (5, 3, 3, 2)), ("zeros", "ones"), ("zeros", "ones")
    ):
        factory = lambda a=axis, m=mean_init, v=var_init: layers.BatchNormalization(
            axis=a, momentum=0.9, moving_mean_initializer=m, moving_variance_initializer=v
        )
        rows.append(
            (f"bn_correctness-axis{axis}-{'x'.join(map(str, shape))}-{mean_init}-{var_init}", factory, shape, False)
        )
    return rows


#: (id, layer factory, input shape, randomise the moving statistics too)
CONFIGS = [
    ("bn_basics-vector", lambda: layers.BatchNormalization(center=True, scale=True), (2, 3), True),
    ("bn_basics-vector-no_affine", lambda: layers.BatchNormalization(center=False, scale=False), (2, 3), True),
    ("bn_basics-image", lambda: layers.BatchNormalization(center=True, scale=True), (2, 4, 4, 3), True),
    (
        "bn_trainable_behavior",
        lambda: layers.BatchNormalization(axis=-1, momentum=0.8, epsilon=1e-7),
        (10, 4, 4, 3),
        True,
    ),
    *_bn_correctness(),
    ("gn_basics-groups32", lambda: layers.GroupNormalization(), (3, 4, 32), False),
    ("gn_basics-groups4", lambda: layers.GroupNormalization(groups=4), (3, 4, 4), False),
    (
        "gn_instance_norm-groups-1",
        lambda: layers.GroupNormalization(groups=-1, axis=-1, scale=False, center=False),
        (2, 5, 4),
        False,
    ),
    (
        "gn_correctness_1d-1group",
        lambda: layers.GroupNormalization(groups=1, axis=-1, scale=False, center=False),
        (1, 8),
        False,
    ),
    (
        "gn_correctness_1d-2groups-axis1",
        lambda: layers.GroupNormalization(groups=2, axis=1, scale=False, center=False),
        (1, 8),
        False,
    ),
    (
        "gn_correctness_2d-1group",
        lambda: layers.GroupNormalization(groups=1, axis=-1, scale=False, center=False),
        (1, 2, 4),
        False,
    ),
    (
        "gn_correctness_2d-2groups-axis2",
        lambda: layers.GroupNormalization(groups=2, axis=2, scale=False, center=False),
        (1, 2, 4),
        False,
    ),
    ("gn_broadcasting_2d_channels_first", lambda: layers.GroupNormalization(groups=2, axis=1), (1, 4, 2, 2), False),
    ("ln_basics", lambda: layers.LayerNormalization(), (3, 4, 2), False),
    ("ln_basics-no_affine", lambda: layers.LayerNormalization(scale=False, center=False), (3, 3), False),
    ("ln_basics-three_axes", lambda: layers.LayerNormalization(axis=(-3, -2, -1)), (2, 8, 8, 3), False),
    ("ln_basics-empty", lambda: layers.LayerNormalization(), (1, 0, 10), False),
    ("ln_unsorted_axis", lambda: layers.LayerNormalization(axis=[-1, -2]), (2, 3, 4), False),
    ("rms_basics", lambda: layers.RMSNormalization(), (4, 2), False),
    ("rms_basics-axis-1", lambda: layers.RMSNormalization(axis=-1), (4, 2), False),
    ("rms_unsorted_axis", lambda: layers.RMSNormalization(axis=[-1, -2]), (2, 3, 4), False),
]
IDS = [row[0] for row in CONFIGS]


def built_layer(factory, shape, statistics: bool, seed: int = 0):
    """The configured layer built for `shape`, its affine state (and, when asked, its statistics) random."""
    layer = factory()
    layer.build((None,) + tuple(shape[1:]))
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        name = variable.path.rsplit("/", 1)[-1]
        if name in ("gamma", "scale"):
            variable.assign((rng.uniform(0.5, 1.5, variable.shape)).astype(variable.dtype))
        elif name == "beta" or (statistics and name == "moving_mean"):
            variable.assign(rng.standard_normal(variable.shape).astype(variable.dtype))
        elif statistics and name == "moving_variance":
            variable.assign(rng.uniform(0.5, 2.0, variable.shape).astype(variable.dtype))
    return layer


def layout_of(spec) -> str | None:
    return None if KIND_INFO[spec.kind].trailing and spec.layout != "channels_first" else spec.layout


def config_input(shape, seed: int = 1) -> np.ndarray:
    """The Keras tests' inputs: normal, loc 5, scale 10."""
    return np.random.default_rng(seed).normal(loc=5.0, scale=10.0, size=shape).astype(np.float32)


def assert_reference(out_cf: np.ndarray, spec, x_cf: np.ndarray, framework: str, what: str) -> None:
    expected = reference.forward(spec, x_cf, training=False)
    atol, rtol = output_tolerances(REGISTRY.framework(framework), spec, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(np.asarray(out_cf, dtype=np.float64), expected, atol=atol, rtol=rtol, err_msg=what)


@pytest.mark.parametrize("factory,shape,statistics", [row[1:] for row in CONFIGS], ids=IDS)
def test_a_keras_configuration_is_read_and_computes_the_same_in_every_framework(factory, shape, statistics):
    layer = built_layer(factory, shape, statistics)
    spec = to_spec(layer)
    assert spec.input_rank == len(shape)
    x = config_input(shape)  # in the layer's own layout
    x_cf = to_channels_first(x, layout_of(spec))
    assert_reference(
        to_channels_first(np.asarray(layer(x, training=False)), layout_of(spec)),
        spec,
        x_cf,
        "keras",
        "Keras differs from the reference of the spec read from it",
    )
    for target in ("torch", "onnx"):
        obj = from_spec(spec, target)
        target_spec = to_spec(obj)
        out = REGISTRY.framework(target).run_eval(obj, from_channels_first(x_cf, layout_of(target_spec)))
        assert_reference(
            to_channels_first(np.asarray(out), layout_of(target_spec)), spec, x_cf, target, f"{target} on {shape}"
        )


@pytest.mark.parametrize("factory,shape,statistics", [row[1:] for row in CONFIGS], ids=IDS)
def test_back_to_keras_with_no_rank_the_layer_takes_the_configuration_s_rank_on_first_call(factory, shape, statistics):
    spec = to_spec(built_layer(factory, shape, statistics)).replace(input_rank=None)
    back = from_spec(spec, "keras")
    rank_lines = [t for t in last_report().layers[0].translations if t.setting == "input_rank"]
    assert rank_lines and rank_lines[0].note, "the report says which rank the layer takes, and why"
    x_cf = to_channels_first(config_input(shape, seed=2), layout_of(spec))
    out = back(from_channels_first(x_cf, layout_of(to_spec(back))), training=False)
    assert_reference(
        to_channels_first(np.asarray(out), layout_of(to_spec(back))),
        spec,
        x_cf,
        "keras",
        f"keras, first call on {shape}",
    )
    read = to_spec(back)
    assert all(np.array_equal(read.tensors[name], spec.tensors[name]) for name in spec.tensors), "state not bit-exact"


@pytest.mark.parametrize("shape", [(6, 6), (6, 5, 6), (2, 4, 5, 6)], ids=["rank2", "rank3", "rank4"])
def test_a_groupnorm_and_a_flat_batchnorm_converted_without_a_rank_take_any_rank(shape):
    """The same spec, one fresh layer per rank: GroupNorm takes every rank, a 1-d BatchNorm (N, C) and (N, C, L)."""
    group = to_spec(built_layer(lambda: layers.GroupNormalization(groups=3, epsilon=1e-4), (2, 6), False)).replace(
        input_rank=None
    )
    batch = to_spec(built_layer(lambda: layers.BatchNormalization(epsilon=1e-4), (2, 6), True)).replace(input_rank=None)
    for spec in (group, batch):
        if spec.kind == "batch" and len(shape) > 3:
            continue  # a BatchNorm1d's spec: rank 2 or 3; rank 4 is a BatchNorm2d's
        layer = from_spec(spec, "keras")
        assert not layer.built
        x_cf = to_channels_first(config_input(shape, seed=3), "channels_last")
        assert_reference(
            to_channels_first(np.asarray(layer(from_channels_first(x_cf, "channels_last"))), "channels_last"),
            spec,
            x_cf,
            "keras",
            f"{spec.kind} on {shape}",
        )


def test_rms_scaling_is_refused_naming_the_setting():
    """layer_normalization_test.py's rms_scaling=True configuration: no PyTorch or ONNX layer computes it."""
    layer = built_layer(lambda: layers.LayerNormalization(rms_scaling=True, name="ln_rms"), (3, 3), False)
    with pytest.raises(SpecError) as refused:
        to_spec(layer)
    assert (refused.value.layer, refused.value.setting) == ("ln_rms", "rms_scaling")


@pytest.mark.slow
@pytest.mark.parametrize("factory,shape,statistics", [row[1:] for row in CONFIGS], ids=IDS)
def test_a_keras_configuration_passes_the_equivalence_check(factory, shape, statistics):
    """converters.check: every framework, eval and one training step, and the round trip back to Keras."""
    result = converters.check(built_layer(factory, shape, statistics))
    assert result.passed, (result.errors, [(t.framework, t.status, t.reason) for t in result.targets])
