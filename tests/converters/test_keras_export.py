"""Keras -> ONNX on real Keras models: native normalization ops, exact state, and the serving contract.

Fast rows build the one construct each real family broke the old path with (a grouped
convolution and exact GELU: ConvNeXt; dict inputs: keras_hub); slow rows export the real
keras.applications families and a keras_hub backbone, every normalization given a random state.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

keras = pytest.importorskip("keras")

from converters.keras_adapter import onnx_export  # noqa: E402
from converters.keras_adapter.keras_internals import all_layers  # noqa: E402
from converters.models.serving.export import export_for_serving, source_specs  # noqa: E402
from converters.models.serving.samples import as_sample, input_specs  # noqa: E402
from schemas import UnsupportedObjectError  # noqa: E402
from tests.process_limits import MAX_RSS_MB  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def randomise_norms(model, seed=0):
    """Random statistics, scales and biases in every normalization layer (identity state hides conversion bugs)."""
    rng = np.random.default_rng(seed)
    for layer in all_layers(model):
        if isinstance(layer, keras.layers.Normalization) or getattr(layer, "_layers", None):
            continue
        if isinstance(layer, keras.layers.BatchNormalization) or "norm" in type(layer).__name__.lower():
            for variable in layer.weights:
                name = variable.path.rsplit("/", 1)[-1]
                values = (
                    rng.uniform(0.5, 2.0, tuple(variable.shape))
                    if name == "moving_variance"
                    else rng.standard_normal(tuple(variable.shape)) * 0.3 + 0.1
                )
                variable.assign(values.astype(variable.dtype))
    return model


def convnext_block():
    inputs = keras.Input((8, 8, 4))
    x = keras.layers.Conv2D(4, 3, padding="same", groups=4, name="depthwise")(inputs)
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="ln")(x)
    return keras.Model(inputs, keras.layers.Dense(8, activation="gelu")(x))  # exact GELU: Erfc in TF


def dict_inputs():
    a, b = keras.Input((6,), name="token_features"), keras.Input((6,), name="mask_features")
    x = keras.layers.Add()([keras.layers.Dense(6)(a), b])
    return keras.Model(
        {"token_features": a, "mask_features": b}, keras.layers.LayerNormalization(epsilon=1e-5, name="ln")(x)
    )


def exported_ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def check_export(model, tmp_path):
    randomise_norms(model)
    specs = source_specs(model)
    result = export_for_serving(model, tmp_path / "model.onnx")
    assert result.passed and result.contract.passed, result.failed_checks
    assert len(onnx.load(str(tmp_path / "model.onnx")).graph.input) == len(model.inputs)
    ops = exported_ops(tmp_path / "model.onnx")
    for kind, op in (("batch", "BatchNormalization"), ("layer", "LayerNormalization"), ("rms", "RMSNormalization")):
        assert ops.count(op) == sum(s.kind == kind for s in specs), (kind, ops.count(op))
    verified = {v.source_layer for v in result.verification if v.setting == "eps" and v.passed}
    assert len(verified) == len({s.name for s in specs})
    return result, ops


@pytest.mark.slow
def test_a_grouped_convolution_and_exact_gelu_export(tmp_path):
    _, ops = check_export(convnext_block(), tmp_path)
    assert "StatefulPartitionedCall" not in ops and "Erf" in ops


def test_dict_inputs_export_and_pass_the_contract(tmp_path):
    check_export(dict_inputs(), tmp_path)


def test_the_keras_export_path_s_error_names_no_temporary_file():
    model = convnext_block()
    sample = as_sample(None, input_specs(model))
    with pytest.raises(UnsupportedObjectError) as caught:
        onnx_export.export_with_keras(model, sample, 18)
    assert "tmp" not in str(caught.value) and "StatefulPartitionedCall" in str(caught.value)


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


APPLICATIONS = {
    # 64x64 here; at 32x32 the last stage is 1x1 (test_keras_export_families.py: the LayerNorms there, issue 34).
    "ConvNeXtTiny": lambda: keras.applications.ConvNeXtTiny(weights=None, input_shape=(64, 64, 3)),
    "EfficientNetB0": lambda: keras.applications.EfficientNetB0(weights=None, input_shape=(32, 32, 3)),
    "MobileNetV3Small": lambda: keras.applications.MobileNetV3Small(weights=None, input_shape=(32, 32, 3)),
    "keras_hub GemmaBackbone (dict inputs, x * (1 + w))": keras_hub_gemma,
}
#: Rows exported in a fresh Python process: tf2onnx's freezing and grappler take ConvNeXtTiny's export to about 3.2 GB
#: at its peak, and TensorFlow keeps most of it; in a long-lived xdist worker that already holds other models it would
#: pass the 4 GB a test process may use (tests/process_limits.py). A CLI `export` is such a fresh process too.
IN_A_FRESH_PROCESS = {"ConvNeXtTiny"}


def export_application(name: str, folder: str) -> None:
    """Build the named application and check its export (the body of the test, also run by a child process)."""
    check_export(APPLICATIONS[name](), Path(folder))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(APPLICATIONS))
def test_a_real_keras_family_exports_with_native_norms_and_passes_the_contract(name, tmp_path):
    if name not in IN_A_FRESH_PROCESS:
        export_application(name, str(tmp_path))
        return
    code = (
        "from tests.converters.test_keras_export import export_application; from tests.process_limits import peak_rss_mb; "
        f"export_application({name!r}, {str(tmp_path)!r}); print('peak_mib', peak_rss_mb())"
    )
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-5000:]
    assert (tmp_path / "model.onnx").is_file()
    peak = float(child.stdout.split("peak_mib")[-1])
    assert peak < MAX_RSS_MB, (
        f"the export's process reached {peak:.0f} MiB, over the {MAX_RSS_MB} MiB a test process may use"
    )


def test_a_folded_offset_left_behind_a_transpose_is_unfolded_into_a_native_batchnorm():
    """tf2onnx's graph when its transpose optimizer fails (MobileNetV3 with trained statistics): Conv,
    Transpose, Add(offset)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import converters
    from converters.onnx_adapter.graph.rewrite import folded_constants, rewrite_decompositions
    from converters.onnx_adapter.graph.unfold import ConvBatchNorm, unfold_conv_batchnorms

    rng = np.random.default_rng(1)
    bn = keras.layers.BatchNormalization(name="bn")
    bn.build((None, 5, 5, 4))
    for variable, values in zip(
        (bn.gamma, bn.beta, bn.moving_mean, bn.moving_variance),
        (rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(4), rng.uniform(0.5, 2, 4)),
    ):
        variable.assign(values.astype("float32"))
    spec = converters.to_spec(bn)
    kernel = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    k, offset = folded_constants(spec)
    folded = (kernel.astype(np.float64) * k.reshape(-1, 1, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["c"], ["t"], name="to_nhwc", perm=[0, 2, 3, 1]),
        helper.make_node("Add", ["t", "offset"], ["y"], name="bn/add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 5, 5, 4])],
        [numpy_helper.from_array(folded, "w"), numpy_helper.from_array(offset.astype(np.float32), "offset")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    unfolded, names = unfold_conv_batchnorms(model, [ConvBatchNorm("bn", kernel, None, spec)])
    assert names == ["bn"]
    final, _ = rewrite_decompositions(unfolded, 18, [spec])
    assert [n.op_type for n in final.graph.node].count("BatchNormalization") == 1
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    np.testing.assert_allclose(run(final), run(model), rtol=1e-5, atol=1e-5)


def _onnx_output(path, x):
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_two_norms_named_as_keras_names_them_are_each_checked_against_their_own_graph_site(tmp_path):
    """'norm' and 'norm_1', the names Keras gives two unnamed layers of a class: tf2onnx scopes them 'norm_1' and
    'norm_1_2', so graph site 'norm_1' is layer 'norm''s. Each layer is checked against its own site;
    a wrong eps in the file still fails."""
    from converters.models.serving.verification import verify_sites
    from converters.onnx_adapter.graph.sites import find_norm_sites

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 12))
    h = keras.layers.Dense(12)(inputs)
    a = keras.layers.LayerNormalization(epsilon=1e-3, name="norm")(h)
    b = keras.layers.LayerNormalization(epsilon=1e-5, name="norm_1")(a)
    model = keras.Model(inputs, keras.layers.Add()([a, b]))
    model.get_layer("norm_1").gamma.assign(np.full(12, 2.0, "float32"))
    path = tmp_path / "names.onnx"
    result = export_for_serving(model, path)
    assert result.passed and result.written, result.failed_checks
    eps = {v.source_layer: v.found for v in result.verification if v.setting == "eps"}
    assert eps == {"norm": "0.001", "norm_1": "1e-05"}
    x = np.random.default_rng(0).standard_normal((3, 16, 12)).astype(np.float32)
    np.testing.assert_allclose(_onnx_output(path, x), keras.ops.convert_to_numpy(model(x)), atol=1e-5)

    exported = onnx.load(str(path))
    second = [n for n in exported.graph.node if n.op_type == "LayerNormalization"][
        1
    ]  # layer norm_1's node, in graph order
    next(a for a in second.attribute if a.name == "epsilon").f = 1e-3
    failed = [
        (v.source_layer, v.setting)
        for v in verify_sites(source_specs(model), find_norm_sites(exported))
        if not v.passed
    ]
    assert failed == [("norm_1", "eps")]


def test_group_normalization_with_one_group_is_verified_as_a_group_norm(tmp_path):
    """GroupNormalization(groups=1) reshapes (N, H, W, C) to (N, H, W, 1, C): the inserted axis reads as a split of W
    into (W, 1) too; the axes the statistics cover tell that it splits C, so the site is a group norm with one group and
    the source's eps."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 12))
    x = keras.layers.Reshape((4, 4, 12))(inputs)
    model = randomise_norms(keras.Model(inputs, keras.layers.GroupNormalization(groups=1, epsilon=0.02, name="gn")(x)))
    path = tmp_path / "gn1.onnx"
    result = export_for_serving(model, path)
    assert result.passed and result.written, result.failed_checks
    assert {(v.source_layer, v.setting, v.found) for v in result.verification if v.setting == "eps"} == {
        ("gn", "eps", "0.02")
    }
    nodes = [n for n in onnx.load(str(path)).graph.node if n.op_type == "GroupNormalization"]
    assert len(nodes) == 1 and next(a.i for a in nodes[0].attribute if a.name == "num_groups") == 1
    x = np.random.default_rng(0).standard_normal((3, 16, 12)).astype(np.float32)
    x[1] *= 1e-4
    np.testing.assert_allclose(_onnx_output(path, x), keras.ops.convert_to_numpy(model(x)), atol=1e-5)
