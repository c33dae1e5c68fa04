"""Keras mixed precision -> ONNX: trained float32 state under a mixed policy, and float16 tensors around float32 norms.

Keras's normalization layers compute in float32 whatever their input: a mixed_float16 layer casts its float16 input up,
applies its float32 variables there and casts back; a float32 layer after a mixed_float16 Dense does the same with its
float16 input. tf2onnx keeps those Casts; the rewrite must keep the site's input and output dtypes (it used to write a
float16 native op whose float32 consumers onnxruntime refused) and the float32 coefficients (it used to round them to
float16).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

keras = pytest.importorskip("keras")

from converters.models.serving.export import export_for_serving  # noqa: E402

#: float16 outputs agree to a few float16 ulps: |a - b| <= atol + rtol * |b|.
FLOAT16_TOLERANCE = dict(atol=4 * 2.0**-10, rtol=4 * 2.0**-10)


def _assign_trained(model, seed=0):
    """State no float16 holds in every normalization layer (a trained model's float32 variables)."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if "norm" in type(layer).__name__.lower():
            for variable in layer.weights:
                variable.assign((rng.uniform(0.5, 2.0, tuple(variable.shape)) + 2.0**-14).astype("float32"))


def _run_onnx(path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_a_float32_norm_after_a_mixed_float16_dense_exports_a_graph_onnxruntime_loads(norm, tmp_path):
    """Dense(dtype='mixed_float16') then a float32 LayerNormalization/RMSNormalization: the site reads float16 and its
    consumers read float32; the native op runs in float32 between Casts (it was a float16 op writing a float32
    tensor)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((10,))
    x = keras.layers.Dense(16, dtype="mixed_float16")(inputs)
    x = {"layer": keras.layers.LayerNormalization, "rms": keras.layers.RMSNormalization}[norm](name="norm")(x)
    model = keras.Model(inputs, keras.layers.Dense(3)(x))
    _assign_trained(model)
    # force: the contract holds a float32 output to float32 tolerances, which float16 matmuls in two runtimes need not
    # meet (and tf2onnx drops the float16 rounding of RMSNormalization's output, its Cast to float16 and back); the
    # rewritten site itself must be valid and verified, and the graph must compute what Keras computes to float16
    # precision.
    result = export_for_serving(model, tmp_path / "model.onnx", force=True)
    assert result.errors == [] and all(v.passed for v in result.verification), result.failed_checks
    ops = [n.op_type for n in onnx.load(str(tmp_path / "model.onnx")).graph.node]
    assert {"layer": "LayerNormalization", "rms": "RMSNormalization"}[norm] in ops
    sample = np.random.default_rng(1).standard_normal((4, 10)).astype(np.float32)
    got = _run_onnx(tmp_path / "model.onnx", sample)
    np.testing.assert_allclose(got, keras.ops.convert_to_numpy(model(sample)), atol=2e-3, rtol=2e-2)


@pytest.mark.parametrize("policy", ["mixed_float16", "float16"])
def test_a_float16_model_with_trained_norms_exports_with_native_ops_and_matches_keras(policy, tmp_path):
    """LayerNormalization, RMSNormalization, BatchNormalization and GroupNormalization under mixed_float16 with trained
    float32 state (read, no longer refused) or under float16: each rewritten into its native op in float32 between Casts
    (GroupNormalization's Cast after its Reshape, BatchNormalization's float32 folded constants paired with its float16
    spec: they used to be missing and unreadable), verified, and the serving graph computes what Keras computes."""
    keras.utils.set_random_seed(0)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        L = keras.layers
        inputs = keras.Input((16, 12))
        h = L.LayerNormalization(epsilon=1e-5, name="ln_a")(L.Dense(12)(inputs))
        h = L.RMSNormalization(epsilon=1e-6, name="rms_b")(L.Dense(12)(h))
        h = L.BatchNormalization(name="bn_c")(L.Reshape((4, 4, 12))(h))
        h = L.GroupNormalization(groups=3, name="gn_d")(h)
        model = keras.Model(inputs, L.Activation("linear", dtype="float32")(h))
    finally:
        keras.config.set_dtype_policy(previous)
    _assign_trained(model)
    result = export_for_serving(model, tmp_path / "model.onnx")
    assert result.passed, result.failed_checks
    assert {v.source_layer for v in result.verification if v.setting == "eps" and v.passed} == {
        "ln_a",
        "rms_b",
        "bn_c",
        "gn_d",
    }
    ops = [n.op_type for n in onnx.load(str(tmp_path / "model.onnx")).graph.node]
    for op in ("LayerNormalization", "RMSNormalization", "BatchNormalization", "GroupNormalization"):
        assert ops.count(op) == 1, (op, ops)
    x = np.random.default_rng(1).standard_normal((3, 16, 12)).astype(np.float32)
    x[1] *= 1e-3
    np.testing.assert_allclose(
        _run_onnx(tmp_path / "model.onnx", x), keras.ops.convert_to_numpy(model(x)), **FLOAT16_TOLERANCE
    )
