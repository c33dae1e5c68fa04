"""keras_internals: every private Keras and TensorFlow access works on the installed Keras, its public replacement gives
the same answer, and a model whose layers cannot be listed is refused instead of passing with none.

The table (`ACCESSES`) runs each access of converters/keras_adapter/keras_internals.py on this Keras. The fallbacks are
held equal to the private paths on real models (Sequential, functional with a nested Sequential, subclassed with layers
in lists and dicts, a keras_hub backbone). The unrecognised-layer safety net is exercised on a Keras that lost
`_flatten_layers`: the look-alike layer is still named (before keras_internals it was silently not looked at).
"""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from converters.keras_adapter import keras_internals as internals  # noqa: E402
from converters.keras_adapter.unrecognised import unrecognised_hazards  # noqa: E402
from schemas import UnsupportedObjectError  # noqa: E402


class Block(keras.layers.Layer):
    """Sublayers held in a list, a dict and an attribute (what Keras tracks)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.norms = [keras.layers.LayerNormalization(), keras.layers.LayerNormalization()]
        self.heads = {"a": keras.layers.Dense(4)}
        self.mix = keras.layers.Dense(4)

    def build(self, shape):
        for layer in (*self.norms, self.heads["a"]):
            layer.build(shape)
        self.mix.build((*shape[:-1], 4))

    def call(self, x):
        return self.mix(self.heads["a"](self.norms[1](self.norms[0](x))))


class Stacked(keras.Model):
    def __init__(self):
        super().__init__()
        self.first, self.second, self.out = Block(), Block(), keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.second(self.first(x)))


class ShiftNorm(keras.layers.Layer):
    """Looks like a normalization (its name) and computes x + gamma: no recognizer proves it."""

    def build(self, shape):
        self.gamma = self.add_weight(shape=(shape[-1],), initializer="ones")

    def call(self, x):
        return x + self.gamma


def sequential():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.BatchNormalization()])


def functional():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3)(inputs))
    x = keras.Sequential([keras.layers.Dense(2), keras.layers.LayerNormalization()])(x)
    return keras.Model(inputs, keras.layers.Dense(1)(Block()(x)))


def subclassed():
    model = Stacked()
    model(np.ones((2, 4), "float32"))
    return model


def keras_hub_gemma():
    keras_hub = pytest.importorskip("keras_hub")
    return keras_hub.models.GemmaBackbone(
        vocabulary_size=64,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
        head_dim=8,
    )


def with_lookalike():
    inputs = keras.Input((5, 4))
    return keras.Model(inputs, ShiftNorm(name="odd_norm")(keras.layers.Dense(4)(inputs)))


def dict_inputs():
    inputs = {"ids": keras.Input((3,), name="ids"), "mask": keras.Input((3,), name="mask")}
    return keras.Model(inputs, keras.layers.Add()([inputs["ids"], inputs["mask"]]))


MODELS = {
    "Sequential": sequential,
    "functional, nested": functional,
    "subclassed": subclassed,
    "keras_hub Gemma": keras_hub_gemma,
}


def _shown(layers) -> list[str]:
    """The layers as names, without the InputLayers a Sequential's public `layers` leaves out
    (they hold nothing normbridge reads)."""
    return [layer.name for layer in layers if not isinstance(layer, keras.layers.InputLayer)]


@pytest.mark.parametrize("build", list(MODELS.values()), ids=list(MODELS))
def test_the_public_walk_finds_the_layers_keras_s_own_walk_finds(build):
    model = build()
    private = model._flatten_layers(include_self=False, recursive=True)
    assert internals.all_layers(model) == private
    assert _shown(internals.public_layers(model)) == _shown(private)
    for layer in private:
        assert internals.sublayers(layer) == list(layer._layers)
        assert _shown(internals._public_sublayers(layer)) == _shown(layer._layers), layer.name


def test_a_keras_without_flatten_layers_still_reports_the_lookalike(monkeypatch):
    model = with_lookalike()
    assert [h.layer for h in unrecognised_hazards(model)] == ["odd_norm"]
    monkeypatch.delattr(keras.layers.Layer, "_flatten_layers")  # as in a Keras that renamed it
    assert [h.layer for h in unrecognised_hazards(model)] == ["odd_norm"]


def test_a_model_whose_layers_cannot_be_listed_is_refused_not_read_as_empty(monkeypatch):
    model = with_lookalike()
    monkeypatch.delattr(keras.layers.Layer, "_flatten_layers")
    monkeypatch.setattr(internals, "_public_sublayers", lambda layer: [])  # and whose layers no public attribute holds
    with pytest.raises(
        UnsupportedObjectError,
        match=rf"Keras model '{model.name}' lists 3 layers in `layers`, but neither Keras .* found any",
    ):
        internals.all_layers(model)
    with pytest.raises(UnsupportedObjectError):
        unrecognised_hazards(model)


def test_a_layer_without_sublayers_has_none_either_way():
    dense = keras.layers.Dense(2)
    dense.build((None, 3))
    assert (
        internals.all_layers(dense) == []
        and internals.public_layers(dense) == []
        and not internals.has_sublayers(dense)
    )


def test_inputs_structure_and_its_public_replacement():
    model = dict_inputs()
    assert internals.inputs_structure(model) is model._inputs_struct
    assert model.input is model._inputs_struct  # the public replacement, on this Keras
    assert set(internals.inputs_structure(model)) == {"ids", "mask"}


def test_producing_layer_and_its_public_replacement(monkeypatch):
    model = functional()
    layers = internals.all_layers(model)
    bn = next(layer for layer in layers if isinstance(layer, keras.layers.BatchNormalization))
    conv = next(layer for layer in layers if isinstance(layer, keras.layers.Conv2D))
    assert internals.producing_layer(bn.input, layers) is conv
    monkeypatch.delattr(bn.input, "_keras_history")
    assert internals.producing_layer(bn.input, layers) is conv


def test_autocast_flags():
    bn, dense = keras.layers.BatchNormalization(), keras.layers.Dense(2)
    bn.build((None, 3)), dense.build((None, 3))
    assert {internals.autocasts(v) for v in bn.weights} == {False}  # Keras creates them with autocast=False
    assert {internals.autocasts(v) for v in dense.weights} == {True}


def test_the_variable_counting_accesses():
    before = internals.uninitialized_variables()
    internals.set_uninitialized_variables(["marker"])
    try:
        assert internals.uninitialized_variables() == ["marker"]
    finally:
        internals.set_uninitialized_variables(before)
    with internals.object_sharing_scope():
        pass


def test_plain_convolutions_replace_keras_s_conv_and_fall_back_to_it(monkeypatch):
    import threading

    from keras.src.backend.tensorflow import nn as keras_tf_nn

    original = keras_tf_nn.conv
    with internals.plain_convolutions(threading.Lock()):
        assert keras_tf_nn.conv is not original
        x = np.random.default_rng(0).standard_normal((1, 5, 5, 4)).astype("float32")
        kernel = np.random.default_rng(1).standard_normal((3, 3, 1, 4)).astype("float32")  # grouped: 4 groups
        plain = np.asarray(keras_tf_nn.conv(x, kernel, padding="same"))
    assert keras_tf_nn.conv is original
    np.testing.assert_allclose(plain, np.asarray(original(x, kernel, padding="same")), rtol=1e-5, atol=1e-5)
    monkeypatch.delattr(keras_tf_nn, "_convert_data_format")
    with internals.plain_convolutions(threading.Lock()):
        assert keras_tf_nn.conv is original  # Keras's own conv is traced


class _Concrete:
    """A concrete function without TensorFlow's private `_inference_function` (as in a TensorFlow that renamed it)."""

    def __init__(self, concrete):
        self.concrete, self.captured_inputs = concrete, concrete.captured_inputs

    def __call__(self, *args):
        return self.concrete(*args)


def test_the_flat_call_and_its_fallback_give_the_function_s_own_result():
    import tensorflow as tf

    variable = tf.Variable(np.arange(4.0, dtype="float32"))
    function = tf.function(lambda x: x * variable + 1.0, autograph=False)
    x = tf.constant(np.linspace(-1, 1, 4, dtype="float32"))
    concrete = function.get_concrete_function(x)
    expected = concrete(x).numpy()
    assert internals.plain_graphs_available()
    with internals.plain_graphs():
        assert np.array_equal(internals.called_flat(concrete, x, [x]).numpy(), expected)
        assert np.array_equal(internals.called_flat(_Concrete(concrete), x, [x]).numpy(), expected)


def test_plain_graphs_set_the_call_options_for_the_block_only():
    from tensorflow.python.eager import context

    before = context.context().function_call_options
    with internals.plain_graphs():
        inside = context.context().function_call_options
        assert inside.executor_type == "SINGLE_THREADED_EXECUTOR"
    assert context.context().function_call_options is before


def test_without_plain_graphs_keras_layers_run_eagerly(monkeypatch):
    from converters.keras_adapter import framework

    layer = keras.layers.LayerNormalization()
    layer.build((None, 4))
    monkeypatch.setattr(framework, "plain_graphs_available", lambda: False)
    assert framework.KerasFramework().kept_runs(layer) is None


# tf2onnx's transpose optimizer at 1x1
from tests.converters import test_keras_export_families as families  # noqa: E402
from tests.converters.test_keras_export_families import take_tf2onnx_public_path  # noqa: E402


#: Each access of keras_internals and the test above that runs it on this Keras.
def _exported(model):
    from converters.keras_adapter.tf2onnx_export import export_model

    proto = export_model(model, 18)  # node names carry tf2onnx's process-wide counter: compared without them
    return [n.op_type for n in proto.graph.node], sorted(i.raw_data for i in proto.graph.initializer)


def test_tf2onnx_without_the_optimizers_argument_writes_the_same_graph(monkeypatch):
    """The export's optimizer loop that frees each graph copy (tf2onnx_export) passes its optimizers to tf2onnx's
    private `_convert_common`; a tf2onnx whose `_convert_common` takes no such argument gets
    `tf2onnx.convert.from_function`'s own path, which writes the same graph."""
    model = functional()
    fast = _exported(model)
    take_tf2onnx_public_path(monkeypatch)
    assert _exported(model) == fast


def test_tf2onnx_optimizers_of_another_shape_take_the_public_path():
    def unreadable(default):
        raise AttributeError("'list' object has no attribute 'items'")  # a tf2onnx returning its optimizers otherwise

    assert internals.converted_with_optimizers(object(), unreadable, lambda: "public path") == "public path"


ACCESSES = {
    "all_layers": test_the_public_walk_finds_the_layers_keras_s_own_walk_finds,
    "public_layers": test_the_public_walk_finds_the_layers_keras_s_own_walk_finds,
    "sublayers": test_the_public_walk_finds_the_layers_keras_s_own_walk_finds,
    "has_sublayers": test_a_layer_without_sublayers_has_none_either_way,
    "inputs_structure": test_inputs_structure_and_its_public_replacement,
    "producing_layer": test_producing_layer_and_its_public_replacement,
    "autocasts": test_autocast_flags,
    "uninitialized_variables": test_the_variable_counting_accesses,
    "set_uninitialized_variables": test_the_variable_counting_accesses,
    "object_sharing_scope": test_the_variable_counting_accesses,
    "plain_convolutions": test_plain_convolutions_replace_keras_s_conv_and_fall_back_to_it,
    "called_flat": test_the_flat_call_and_its_fallback_give_the_function_s_own_result,
    "converted_with_optimizers": test_tf2onnx_without_the_optimizers_argument_writes_the_same_graph,
    "plain_graphs": test_plain_graphs_set_the_call_options_for_the_block_only,
    "plain_graphs_available": test_without_plain_graphs_keras_layers_run_eagerly,
    "transposes_kept": families.test_convnext_at_32x32_serves_its_1x1_layer_norms_right,
    "transposes_kept_in_tf2onnx": families.test_tf2onnx_s_own_optimizer_loop_keeps_the_transposes_at_1x1_too,
}


def test_every_access_has_a_test():
    assert set(internals.__all__) == set(ACCESSES)
