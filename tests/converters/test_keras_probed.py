"""Custom Keras normalization layers (keras_hub's and a user's own), recognised by the behavioural probe.

One row per family: the layer is built from its class with a random state, read through
`converters.to_spec`, and must give the right kind, eps, axes, affine factor and variables; its
outputs must equal the NumPy reference of the spec on inputs the probe never saw. Near misses
(layers named like a norm that compute something else) must not be recognised, and inspecting a
model that holds one reports an `unrecognised_normalization` hazard naming it. Converted back to Keras, a
family's spec rebuilds its own class (looked up among registered and already imported classes, never
imported) with identical numbers; to the stock class, the report says what is not kept.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

keras = pytest.importorskip("keras")
keras_hub = pytest.importorskip("keras_hub")

import converters  # noqa: E402
from converters import reference  # noqa: E402
from converters.keras_adapter.keras_internals import all_layers  # noqa: E402
from converters.keras_adapter.probe import probe_layer  # noqa: E402
from converters.models.inspection import inspect_model  # noqa: E402
from schemas import UnsupportedObjectError  # noqa: E402
from schemas.spec_io import load_spec, save_spec  # noqa: E402

from keras_hub.src.layers.modeling.rms_normalization import RMSNormalization as HubRMSNormalization  # noqa: E402
from keras_hub.src.models.gemma.rms_normalization import RMSNormalization as GemmaRMSNormalization  # noqa: E402
from keras_hub.src.models.gemma3.gemma3_layers import RMSNormalization as Gemma3RMSNormalization  # noqa: E402
from keras_hub.src.models.llama.llama_layernorm import LlamaLayerNorm  # noqa: E402
from keras_hub.src.models.mistral.mistral_layer_norm import MistralLayerNormalization  # noqa: E402
from keras_hub.src.models.phi3.phi3_layernorm import Phi3LayerNorm  # noqa: E402
from keras_hub.src.models.qwen.qwen_layernorm import QwenLayerNorm  # noqa: E402
from keras_hub.src.models.roformer_v2.roformer_v2_attention import RoformerNorm  # noqa: E402
from keras_hub.src.models.t5.t5_layer_norm import T5LayerNorm  # noqa: E402

ops = keras.ops


class CentredNorm(keras.layers.Layer):
    """A hand-written LayerNorm with gamma/beta, as many Keras codebases carry one."""

    def __init__(self, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, shape):
        self.gamma = self.add_weight(shape=(shape[-1],), initializer="ones", name="gamma")
        self.beta = self.add_weight(shape=(shape[-1],), initializer="zeros", name="beta")

    def call(self, x):
        mean = ops.mean(x, axis=-1, keepdims=True)
        var = ops.mean(ops.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) / ops.sqrt(var + self.epsilon) * self.gamma + self.beta


class EpsOutsideNorm(keras.layers.Layer):
    """Near miss: eps added to the standard deviation, not to the variance."""

    def build(self, shape):
        self.scale = self.add_weight(shape=(shape[-1],), initializer="ones", name="scale")

    def call(self, x):
        return x / (ops.sqrt(ops.mean(ops.square(x), axis=-1, keepdims=True)) + 1e-3) * self.scale


class BatchAxisNorm(keras.layers.Layer):
    """Near miss: statistics over the batch axis, named like a LayerNorm."""

    def build(self, shape):
        self.gamma = self.add_weight(shape=(shape[-1],), initializer="ones", name="gamma")

    def call(self, x):
        mean = ops.mean(x, axis=0, keepdims=True)
        var = ops.var(x, axis=0, keepdims=True)
        return (x - mean) / ops.sqrt(var + 1e-5) * self.gamma


class UnbiasedLayerNorm(keras.layers.Layer):
    """Near miss: an unbiased (n - 1) variance."""

    def build(self, shape):
        self.gamma = self.add_weight(shape=(shape[-1],), initializer="ones", name="gamma")
        self.beta = self.add_weight(shape=(shape[-1],), initializer="zeros", name="beta")

    def call(self, x):
        n = x.shape[-1]
        mean = ops.mean(x, axis=-1, keepdims=True)
        var = ops.sum(ops.square(x - mean), axis=-1, keepdims=True) / (n - 1)
        return (x - mean) / ops.sqrt(var + 1e-5) * self.gamma + self.beta


FEATURES = 16

#: (id, factory, kind, eps, scale_offset, scale variable, bias variable)
FAMILIES = [
    ("keras_hub gemma RMSNormalization", lambda: GemmaRMSNormalization(epsilon=1e-6), "rms", 1e-6, 1.0, "scale", None),
    (
        "keras_hub gemma3 RMSNormalization",
        lambda: Gemma3RMSNormalization(epsilon=3e-6),
        "rms",
        3e-6,
        1.0,
        "scale",
        None,
    ),
    (
        "keras_hub.layers.RMSNormalization (eps in the code)",
        lambda: HubRMSNormalization(FEATURES),
        "rms",
        1e-6,
        0.0,
        "scale",
        None,
    ),
    ("keras_hub LlamaLayerNorm", lambda: LlamaLayerNorm(epsilon=1e-5), "rms", 1e-5, 0.0, "scale", None),
    (
        "keras_hub MistralLayerNormalization",
        lambda: MistralLayerNormalization(epsilon=2e-6),
        "rms",
        2e-6,
        0.0,
        "scale",
        None,
    ),
    ("keras_hub QwenLayerNorm", lambda: QwenLayerNorm(epsilon=1e-6), "rms", 1e-6, 0.0, "scale", None),
    ("keras_hub Phi3LayerNorm", lambda: Phi3LayerNorm(epsilon=1e-5), "rms", 1e-5, 0.0, "scale", None),
    ("keras_hub RoformerNorm", lambda: RoformerNorm(epsilon=1e-12), "rms", 1e-12, 0.0, "scale", None),
    ("keras_hub T5LayerNorm (weight)", lambda: T5LayerNorm(epsilon=1e-6), "rms", 1e-6, 0.0, "weight", None),
    ("hand-written LayerNorm (gamma, beta)", lambda: CentredNorm(epsilon=1e-4), "layer", 1e-4, 0.0, "gamma", "beta"),
]

NEAR_MISSES = [
    ("eps outside the square root", EpsOutsideNorm),
    ("statistics over the batch axis", BatchAxisNorm),
    ("unbiased variance", UnbiasedLayerNorm),
]


def randomised(layer, shape=(None, 5, FEATURES), seed=0):
    if not layer.built:
        layer.build(shape)
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        variable.assign((rng.standard_normal(tuple(variable.shape)) * 0.5 + 0.2).astype(variable.dtype))
    return layer


@pytest.mark.parametrize(
    "factory,kind,eps,offset,scale,bias", [row[1:] for row in FAMILIES], ids=[row[0] for row in FAMILIES]
)
def test_a_custom_family_is_read_with_its_kind_eps_and_affine(factory, kind, eps, offset, scale, bias):
    layer = randomised(factory())
    spec = converters.to_spec(layer)
    assert (spec.kind, spec.eps, spec.scale_offset, spec.normalized_shape, spec.input_rank) == (
        kind,
        eps,
        offset,
        (FEATURES,),
        3,
    )
    assert spec.source.layer_type == type(layer).__name__
    variables = {v.path.rsplit("/", 1)[-1]: np.asarray(v.numpy()) for v in layer.weights}
    assert np.array_equal(spec.tensors["scale"], variables[scale])
    assert spec.bias == (bias is not None)
    if bias is not None:
        assert np.array_equal(spec.tensors["bias"], variables[bias])
    x = np.random.default_rng(5).standard_normal((2, 7, FEATURES)).astype("float32") * 3 - 1
    got = np.asarray(ops.convert_to_numpy(layer(x)), dtype=np.float64)
    np.testing.assert_allclose(got, reference.forward(spec, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("factory", [row[1] for row in NEAR_MISSES], ids=[row[0] for row in NEAR_MISSES])
def test_a_near_miss_is_not_recognised_and_is_named_as_a_hazard(factory):
    layer = randomised(factory())
    assert probe_layer(layer).norm is None
    with pytest.raises(UnsupportedObjectError):
        converters.to_spec(layer)
    inputs = keras.Input((5, FEATURES))
    model = keras.Model(inputs, factory(name="odd_norm")(keras.layers.Dense(FEATURES)(inputs)))
    found = inspect_model(model)
    assert not found.layers
    hazards = [h for h in found.hazards if h.code == "unrecognised_normalization"]
    assert len(hazards) == 1 and "'odd_norm'" in hazards[0].message and type(layer).__name__ in hazards[0].message


def test_probing_leaves_the_layer_s_variables_as_they_were():
    layer = randomised(GemmaRMSNormalization())
    before = [np.array(v.numpy()) for v in layer.weights]
    probe_layer(layer)
    assert all(np.array_equal(a, np.asarray(v.numpy())) for a, v in zip(before, layer.weights))


def test_a_layer_that_is_not_built_is_reported_not_guessed():
    inputs = keras.Input((5, FEATURES))
    model = keras.Model(inputs, keras.layers.Dense(FEATURES)(inputs))
    loose = GemmaRMSNormalization(name="loose_norm")
    model.loose = loose  # tracked, never called
    assert probe_layer(loose).norm is None and "not built" in probe_layer(loose).reason


def test_a_keras_hub_gemma_backbone_lists_every_rms_norm_with_its_offset():
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=128,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=1,
        hidden_dim=32,
        intermediate_dim=64,
        head_dim=8,
    )
    for layer in all_layers(backbone):
        if isinstance(layer, GemmaRMSNormalization):
            randomised(layer, seed=len(layer.name))
    found = inspect_model(backbone)
    assert [(layer.kind, layer.spec["eps"], layer.spec["scale_offset"]) for layer in found.layers] == [
        ("rms", 1e-6, 1.0)
    ] * 5
    assert not [h for h in found.hazards if h.code == "unrecognised_normalization"]
    # each block's norms share their names: a layer whose name another normalization layer has is named by its path in
    # the model (the bare name made 5 layers 3 paths: export-layers overwrote files, diff could not say which block
    # changed)
    paths = [layer.path for layer in found.layers]
    assert len(set(paths)) == 5 and paths[-1] == "final_normalization"
    assert {"decoder_block_0/pre_attention_norm", "decoder_block_1/pre_attention_norm"} <= set(paths), paths
    from converters.adapters import REGISTRY

    specs = {spec.name: spec for spec in REGISTRY.model_adapter_of(backbone).layer_specs(backbone)}
    for block in ("decoder_block_0", "decoder_block_1"):
        own = next(layer for layer in all_layers(backbone.get_layer(block)) if layer.name == "pre_attention_norm")
        assert np.array_equal(
            specs[f"{block}/pre_attention_norm"].tensors["scale"], own.weights[0].numpy()
        )  # its own block's scale


# -- back to Keras: the source class, rebuilt where it is registered or already imported ------------------------------


def class_lines():
    return [t for t in converters.last_report().layers[0].translations if t.setting == "class"]


def variables_of(layer) -> dict:
    return {v.path.rsplit("/", 1)[-1]: np.asarray(v.numpy()) for v in layer.weights}


@pytest.mark.parametrize(
    "factory,kind,eps,offset,scale,bias", [row[1:] for row in FAMILIES], ids=[row[0] for row in FAMILIES]
)
def test_converting_back_to_keras_rebuilds_the_source_class_with_identical_numbers(
    factory, kind, eps, offset, scale, bias, tmp_path
):
    layer = randomised(factory())
    spec = converters.to_spec(layer)
    assert spec.source.module_class == f"{type(layer).__module__}.{type(layer).__qualname__}"
    for given in (
        spec,
        load_spec(save_spec(spec, tmp_path / "spec")),
    ):  # also from a file: the class is looked up, not imported
        back = converters.from_spec(given, "keras")
        assert type(back) is type(layer)
        [line] = class_lines()
        assert line.fate == "exact" and "proved equal" in line.note
        assert {k: v.tobytes() for k, v in variables_of(back).items()} == {
            k: v.tobytes() for k, v in variables_of(layer).items()
        }
        for shape in [(2, 7, FEATURES), (3, FEATURES)]:
            x = np.random.default_rng(9).standard_normal(shape).astype("float32") * 2 + 0.5
            got = np.asarray(ops.convert_to_numpy(back(x)), dtype=np.float64)
            np.testing.assert_allclose(got, reference.forward(spec, x), rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(
                got, np.asarray(ops.convert_to_numpy(layer(x)), dtype=np.float64)
            )  # the same class, same numbers


@pytest.mark.parametrize(
    "factory,kind,eps,offset,scale,bias", [row[1:] for row in FAMILIES], ids=[row[0] for row in FAMILIES]
)
def test_to_the_stock_class_the_numbers_hold_in_eval_and_the_report_says_what_is_not_kept(
    factory, kind, eps, offset, scale, bias
):
    layer = randomised(factory())
    spec = converters.to_spec(layer)
    stock = converters.from_spec(spec, "keras", restore_source_class=False)
    assert type(stock) is {"rms": keras.layers.RMSNormalization, "layer": keras.layers.LayerNormalization}[kind]
    [line] = class_lines()
    assert line.fate == "dropped" and "restore_source_class=False" in line.note
    if offset:
        offsets = [t for t in converters.last_report().layers[0].translations if t.setting == "scale_offset"]
        assert offsets and offsets[0].fate != "exact"
    x = np.random.default_rng(10).standard_normal((2, 7, FEATURES)).astype("float32") * 2 + 0.5
    np.testing.assert_allclose(
        np.asarray(ops.convert_to_numpy(stock(x)), dtype=np.float64), reference.forward(spec, x), rtol=1e-4, atol=1e-5
    )


def test_a_class_registered_with_keras_saving_is_rebuilt_even_when_no_module_holds_it():
    @keras.saving.register_keras_serializable(package="normbridge_test")
    class LocalRMSNorm(keras.layers.Layer):
        def __init__(self, eps=1e-5, **kwargs):
            super().__init__(**kwargs)
            self.eps = eps

        def build(self, shape):
            self.w = self.add_weight(shape=(shape[-1],), initializer="ones", name="w")

        def call(self, x):
            return x * ops.rsqrt(ops.mean(ops.square(x), axis=-1, keepdims=True) + self.eps) * self.w

    try:
        spec = converters.to_spec(randomised(LocalRMSNorm(eps=2e-5)))
        assert "<locals>" in spec.source.module_class and spec.eps == 2e-5
        back = converters.from_spec(spec, "keras")
        assert type(back) is LocalRMSNorm and "registered with keras.saving" in class_lines()[0].note
    finally:
        keras.saving.get_custom_objects().pop("normbridge_test>LocalRMSNorm", None)
    back = converters.from_spec(spec, "keras")  # no longer registered, and a class inside a function has no import path
    assert type(back) is keras.layers.RMSNormalization and class_lines()[0].fate == "dropped"


def test_a_class_in_a_module_not_imported_is_never_imported_and_the_stock_class_is_built():
    spec = converters.to_spec(randomised(GemmaRMSNormalization(epsilon=1e-6)))
    elsewhere = spec.replace(
        source=spec.source.model_copy(update={"module_class": "normbridge_test_absent.norms.GemmaRMSNorm"})
    )
    back = converters.from_spec(elsewhere, "keras")
    assert type(back) is keras.layers.RMSNormalization
    [line] = class_lines()
    assert line.fate == "dropped" and "never imports a module" in line.note
    assert not [name for name in sys.modules if name.startswith("normbridge_test_absent")]


@pytest.mark.parametrize(
    "path,why",
    [
        ("keras.src.layers.core.lambda_layer.Lambda", "Lambda layer"),
        ("os.path.join", "not a keras.layers.Layer class"),
        ("keras.src.layers.core.dense.Dense", "has no variable 'scale'"),
    ],
)
def test_a_class_that_is_not_a_restorable_normalization_is_refused_with_the_reason(path, why):
    spec = converters.to_spec(randomised(LlamaLayerNorm(epsilon=1e-5)))
    back = converters.from_spec(spec.replace(source=spec.source.model_copy(update={"module_class": path})), "keras")
    assert type(back) is keras.layers.RMSNormalization
    [line] = class_lines()
    assert line.fate == "dropped" and why in line.note, line.note


def test_a_rebuilt_class_that_computes_another_spec_is_not_used():
    """keras_hub.layers.RMSNormalization writes eps 1e-6 in its code: a spec with another eps cannot be that class."""
    spec = converters.to_spec(randomised(HubRMSNormalization(FEATURES))).replace(eps=1e-5)
    back = converters.from_spec(spec, "keras")
    assert type(back) is keras.layers.RMSNormalization and back.epsilon == 1e-5
    [line] = class_lines()
    assert line.fate == "dropped" and "computes another spec (eps" in line.note


def test_keras_hub_qwen3s_per_head_norms_built_with_the_hidden_shape_are_read_as_rms_over_the_head():
    """keras_hub's Qwen3Backbone builds its query and key norms (Qwen3LayerNorm(head_dim)) with the hidden states' shape
    and calls them per head: their scale of head_dim meets inputs whose last axis is head_dim. They were refused as
    unrecognised (error-level: no Qwen3 could register); now each is an rms over head_dim, proved on such an input."""
    import keras_hub

    model = keras_hub.models.Qwen3Backbone(
        vocabulary_size=64,
        num_layers=1,
        hidden_dim=32,
        intermediate_dim=64,
        num_query_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        layer_norm_epsilon=2e-6,
    )
    inspection = inspect_model(model)
    assert not [h for _, h in inspection.all_hazards() if h.code == "unrecognised_normalization"]
    per_head = [
        layer
        for layer in inspection.layers
        if "query_dense_layernorm" in layer.path or "key_dense_layernorm" in layer.path
    ]
    assert len(per_head) == 2 and all(
        layer.kind == "rms" and layer.spec["normalized_shape"] == [8] for layer in per_head
    )
    # what the proof accepted is what the layer computes on the (B, T, heads, head_dim) input the backbone gives it
    layer = next(l for l in all_layers(model) if l.name == per_head[0].path.rsplit("/", 1)[-1])
    assert (
        per_head[0].spec["eps"] == layer.epsilon
    )  # keras_hub 0.32's decoder does not pass layer_norm_epsilon on: 1e-5
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 8)).astype("float32")
    spec = converters.to_spec(layer)
    expected = reference.forward(spec.replace(input_rank=4), x, training=False)
    np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-5, atol=1e-6)
