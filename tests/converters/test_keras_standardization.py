"""keras.layers.Normalization, a frozen standardisation: listed with its statistics, refused as a layer,
kept exactly by export.

Rows: adapted statistics and given ones (ConvNeXt's ImageNet mean and variance), each with a
zero-variance channel so that Keras's epsilon floor on the standard deviation is exercised; the
float64 oracle is `Standardization.forward`, written from the formula, not from Keras's code.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

keras = pytest.importorskip("keras")

import converters  # noqa: E402
from converters.keras_adapter.standardization import read_standardization  # noqa: E402
from converters.models.inspection import inspect_model  # noqa: E402
from converters.models.serving.export import export_for_serving  # noqa: E402
from schemas import UnsupportedObjectError  # noqa: E402

RNG = np.random.default_rng(3)
DATA = RNG.standard_normal((16, 6, 6, 3)) * np.array([2.0, 0.5, 1.0]) + np.array([1.0, -3.0, 0.25])
DATA[..., 2] = 0.25  # one channel constant: variance 0, so max(sqrt(var), epsilon) takes the floor


def adapted():
    layer = keras.layers.Normalization(axis=-1, name="adapted_norm")
    layer.adapt(DATA)
    return layer


def given():
    return keras.layers.Normalization(
        axis=-1,
        mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
        variance=[(0.229 * 255) ** 2, (0.224 * 255) ** 2, 0.0],
        name="given_norm",
    )


ROWS = [("adapted", adapted), ("given mean and variance", given)]


def built(factory):
    layer = factory()
    if not layer.built:
        layer.build((None, 6, 6, 3))
    return layer


@pytest.mark.parametrize("factory", [r[1] for r in ROWS], ids=[r[0] for r in ROWS])
def test_its_statistics_and_epsilon_rule_are_read_exactly(factory):
    layer = built(factory)
    state = read_standardization(layer)
    x = (RNG.standard_normal((2, 6, 6, 3)) * 3).astype("float32")
    got = np.asarray(keras.ops.convert_to_numpy(layer(x)), dtype=np.float64)
    np.testing.assert_allclose(got, state.forward(x), rtol=1e-6, atol=1e-6)
    assert state.epsilon == keras.backend.epsilon() and np.all(state.variance.reshape(-1)[2] == 0)


@pytest.mark.parametrize("factory", [r[1] for r in ROWS], ids=[r[0] for r in ROWS])
def test_it_is_refused_as_a_layer_naming_it_and_listed_by_inspect(factory):
    layer = built(factory)
    with pytest.raises(UnsupportedObjectError, match=f"'{layer.name}' is a frozen standardisation") as caught:
        converters.to_spec(layer)
    assert caught.value.layer == layer.name
    inputs = keras.Input((6, 6, 3))
    model = keras.Model(inputs, keras.layers.Conv2D(2, 1)(factory()(inputs)))
    found = inspect_model(model)
    entries = [h for h in found.hazards if h.code == "frozen_standardization"]
    assert len(entries) == 1 and layer.name in entries[0].message and entries[0].severity == "info"
    mean = read_standardization(model.layers[1]).mean.ravel()
    assert f"{mean[0]:.6g}" in entries[0].message
    assert not [h for h in found.hazards if h.code == "unrecognised_normalization"]


def test_a_never_adapted_layer_is_a_warning():
    inputs = keras.Input((6, 6, 3))
    model = keras.Model(inputs, keras.layers.Normalization(name="fresh")(inputs))
    (entry,) = [h for h in inspect_model(model).hazards if h.code == "frozen_standardization"]
    assert entry.severity == "warning" and "never adapted" in entry.message


def test_export_keeps_its_statistics_as_constants_not_graph_inputs(tmp_path):
    inputs = keras.Input((6, 6, 3))
    norm = adapted()
    x = norm(inputs)
    x = keras.layers.Conv2D(4, 3, padding="same")(x)
    model = keras.Model(inputs, keras.layers.BatchNormalization(name="bn")(x))
    result = export_for_serving(model, tmp_path / "model.onnx")
    assert result.passed and result.contract.passed
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    assert len(session.get_inputs()) == 1  # tf2onnx through model.export made the mean and variance two more inputs
    probe = (RNG.standard_normal((2, 6, 6, 3))).astype("float32")
    served = session.run(None, {session.get_inputs()[0].name: probe})[0]
    expected = keras.ops.convert_to_numpy(model(probe, training=False))
    # The constant channel is divided by the epsilon floor, so outputs reach ~1e6 and float32 sums cancel: an absolute
    # tolerance of one part in 1e6 of the largest output (a few float32 ulps of it), not of each element.
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6 * float(np.abs(expected).max()))
