"""Keras -> ONNX on model families the export once got wrong (issue 34, items 5 to 7), each on the model the issue names
and on another member of its family, every normalization given a random state (at init, scales of 1 hide these bugs).

- Repeated blocks (keras_hub Llama, ViT): tf2onnx scopes every nested layer again on each trace
  ('transformer_layer_0_1/feedforward_layernorm_1'); a layer's path must be found in those scopes, or pairing falls
  back to order and checks each block's norms against its sibling's.
- A LayerNorm at 1x1 spatial (ConvNeXt's last stage at 32x32): tf2onnx's transpose optimizer turned size-1 Transposes
  into Reshapes to stale shapes, serving [N, 1, C, C] for [N, 1, 1, C].
- BatchNorms folded into a separable convolution's pointwise kernel (Xception) are unfolded like those after a Conv2D.

An independent oracle stands beside the export's own verification: the order data flow forces on a chain of norms,
each layer's variables read from Keras, and NumPy's layer norm.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

keras = pytest.importorskip("keras")

from converters.keras_adapter.keras_internals import all_layers  # noqa: E402
from converters.models.serving.export import export_for_serving, source_specs  # noqa: E402
from converters.models.serving.verification import verify_sites  # noqa: E402
from converters.onnx_adapter.graph.sites import find_norm_sites  # noqa: E402
from tests.converters.test_keras_export import randomise_norms  # noqa: E402
from tests.process_limits import MAX_RSS_MB  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _norm_nodes(model: onnx.ModelProto, op: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op]


def _initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def _by_path(model) -> dict:
    return {layer.path: layer for layer in all_layers(model)}


def _variable(layer, name: str) -> np.ndarray:
    return keras.ops.convert_to_numpy(getattr(layer, name))


def _run(path, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _in_a_child(function: str, folder: Path) -> None:
    """Run `function(folder)` of this module in a fresh Python (a full keras.applications export peaks near 3 GB,
    which TF keeps), and hold its peak resident memory to what a test process may use."""
    code = (
        f"from tests.converters.test_keras_export_families import {function}; "
        "from tests.process_limits import peak_rss_mb; "
        f"{function}({str(folder)!r}); print('peak_mib', peak_rss_mb())"
    )
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-5000:]
    peak = float(child.stdout.split("peak_mib")[-1])
    assert peak < MAX_RSS_MB, f"the export's process reached {peak:.0f} MiB, over the {MAX_RSS_MB} MiB allowed"


# --------------------------------------------------------------------------- 5. repeated blocks (keras_hub)


def _check_chain(model, path: Path, op: str, chain: list[tuple[str, dict[str, str]]]) -> None:
    """The written file against the source, independently of the export's verification: `chain` lists the source layers
    in the order data flow forces on them (each norm's input depends on the one before), with their variables by ONNX
    input position; the i-th `op` node of the file must hold the i-th layer's variables, and the export must have paired
    each layer with that node."""
    result = export_for_serving(model, path)
    assert result.passed and result.written, result.failed_checks
    written = onnx.load(str(path))
    nodes = _norm_nodes(written, op)
    assert len(nodes) == len(chain)
    layers = _by_path(model)
    for node, (layer_path, variables) in zip(nodes, chain):
        for position, variable in variables.items():
            held = _initializer(written, node.input[int(position)])
            np.testing.assert_array_equal(
                held,
                _variable(layers[layer_path], variable),
                err_msg=f"{node.name} does not hold {layer_path}.{variable}",
            )
    paired = {v.source_layer: v.site for v in result.verification if v.setting == "eps"}
    names = {spec.name for spec in source_specs(model)}
    expected = {}
    for node, (layer_path, _) in zip(nodes, chain):
        name = layer_path if layer_path in names else layer_path.rsplit("/", 1)[-1]
        expected[name] = node.name
    assert paired == expected


def _swap_first_two_scales_fails_those_two_only(model, path: Path, op: str) -> None:
    """Tampering the file (block 0's two norms swap scales) fails the scale check of exactly those two layers."""
    written = onnx.load(str(path))
    first, second = _norm_nodes(written, op)[:2]
    a, b = first.input[1], second.input[1]
    first.input[1], second.input[1] = b, a
    checks = verify_sites(source_specs(model), find_norm_sites(written))
    failed = sorted((v.source_layer, v.setting) for v in checks if not v.passed)
    layers = sorted({name for name, _ in failed})
    assert len(layers) == 2 and {setting for _, setting in failed} == {"scale"}, failed


def test_llama_backbone_s_repeated_blocks_are_each_verified_against_their_own_norms(tmp_path):
    """Issue 34, item 5: LlamaBackbone with 2 blocks saved as .keras and exported from the file (as `normbridge export
    llama.keras --to onnx` does): each LlamaLayerNorm checked against its own RMSNormalization (it was paired with its
    sibling's and the file refused: 'scale: expected float32[16], found different')."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    source = keras_hub.models.LlamaBackbone(
        vocabulary_size=128, num_layers=2, num_query_heads=2, num_key_value_heads=1, hidden_dim=16, intermediate_dim=32
    )
    randomise_norms(source)
    source.save(tmp_path / "llama.keras")
    model = keras.saving.load_model(tmp_path / "llama.keras")
    chain = [
        (f"transformer_layer_{i}/{norm}", {"1": "scale"})
        for i in range(2)
        for norm in ("self_attention_layernorm", "feedforward_layernorm")
    ]
    chain.append(("sequence_output_layernorm", {"1": "scale"}))
    _check_chain(model, tmp_path / "llama.onnx", "RMSNormalization", chain)
    _swap_first_two_scales_fails_those_two_only(model, tmp_path / "llama.onnx", "RMSNormalization")
    tokens = np.random.default_rng(0).integers(0, 128, (2, 6)).astype(np.int32)
    feeds = {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}
    session = ort.InferenceSession(str(tmp_path / "llama.onnx"), providers=["CPUExecutionProvider"])
    names = [t.name for t in model.inputs]  # the ONNX inputs come in model.inputs order
    got = session.run(None, {i.name: feeds[key] for i, key in zip(session.get_inputs(), names)})[0]
    np.testing.assert_allclose(got, keras.ops.convert_to_numpy(model(feeds)), atol=1e-4, rtol=1e-4)


def test_vit_backbone_s_repeated_blocks_are_each_verified_against_their_own_norms(tmp_path):
    """The same family in keras_hub's ViTBackbone: LayerNorms with a scale and a bias, blocks numbered from 1."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    model = keras_hub.models.ViTBackbone(
        image_shape=(16, 16, 3), patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32
    )
    randomise_norms(model)
    both = {"1": "gamma", "2": "beta"}
    chain = [(f"vit_encoder/transformer_block_{i}/{norm}", both) for i in (1, 2) for norm in ("ln_1", "ln_2")]
    _check_chain(model, tmp_path / "vit.onnx", "LayerNormalization", chain + [("vit_encoder/ln", both)])
    _swap_first_two_scales_fails_those_two_only(model, tmp_path / "vit.onnx", "LayerNormalization")


# --------------------------------------------------------------------------- 6. a LayerNorm at 1x1 spatial (ConvNeXt)


def _small_convnext(size: int, include_top: bool):
    """keras.applications' own ConvNeXt builder (ConvNeXtTiny is depths [3, 3, 9, 3], dims [96, 192, 384, 768]) with one
    block per stage; a layer scale of 0.5 so that no block is an identity."""
    from keras.src.applications.convnext import ConvNeXt

    keras.utils.set_random_seed(0)
    model = ConvNeXt(
        depths=[1, 1, 1, 1],
        projection_dims=[8, 16, 24, 32],
        layer_scale_init_value=0.5,
        input_shape=(size, size, 3),
        include_top=include_top,
        weights=None,
        classes=5,
        name="convnext_small",
    )
    return randomise_norms(model)


def _numpy_layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * gamma + beta


def _check_last_layer_norm_at_1x1(model, path: Path) -> None:
    """Export (no site missing, the contract passed), and the served output against NumPy's layer norm over the channels
    of the last LayerNorm's 1x1 input (Keras computes that input; the norm is the oracle's)."""
    result = export_for_serving(model, path)
    assert result.passed and result.written, result.failed_checks
    specs = source_specs(model)
    assert len(_norm_nodes(onnx.load(str(path)), "LayerNormalization")) == sum(s.kind == "layer" for s in specs)
    last = model.layers[-1]
    assert isinstance(last, keras.layers.LayerNormalization)
    x = np.random.default_rng(1).uniform(0, 255, (3,) + tuple(model.input_shape[1:])).astype(np.float32)
    before = keras.ops.convert_to_numpy(keras.Model(model.input, last.input)(x))
    assert before.shape[1:3] == (1, 1)
    expected = _numpy_layer_norm(before, _variable(last, "gamma"), _variable(last, "beta"), last.epsilon)
    got = _run(path, {onnx.load(str(path)).graph.input[0].name: x})[0]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_convnext_at_32x32_serves_its_1x1_layer_norms_right(tmp_path):
    """Issue 34, item 6, in small config: ConvNeXt at 32x32 without its top, whose last stage is 1x1 and whose output is
    a LayerNorm there (it served [N, 1, C, C] for [N, 1, 1, C], and its stage-3 norms were '(missing)')."""
    _check_last_layer_norm_at_1x1(_small_convnext(32, include_top=False), tmp_path / "convnext.onnx")


def test_convnext_at_36x36_with_its_head_exports_its_1x1_block_norms_natively(tmp_path):
    """Another input size whose last stage is 1x1 (36 -> 9 -> 4 -> 2 -> 1), with the classification head: every block's
    LayerNorm is a native site with the source's state, and the contract passes."""
    model = _small_convnext(36, include_top=True)
    result = export_for_serving(model, tmp_path / "convnext36.onnx")
    assert result.passed and result.written, result.failed_checks
    specs = source_specs(model)
    written = onnx.load(str(tmp_path / "convnext36.onnx"))
    assert len(_norm_nodes(written, "LayerNormalization")) == sum(s.kind == "layer" for s in specs)
    stage3 = [v for v in result.verification if v.source_layer == "convnext_small_stage_3_block_0_layernorm"]
    assert {v.setting for v in stage3} == {"eps", "scale", "bias"} and all(v.passed for v in stage3)


def _convnext_stage_at_1x1():
    """ConvNeXt's last stage alone at 1x1 (a 2x2 downsampling, a depthwise 7x7, a LayerNorm, the MLP, the residual) and
    its output LayerNorm: the smallest graph in which tf2onnx's size-1 Reshapes went wrong."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((2, 2, 8))
    x = keras.layers.Conv2D(16, 2, strides=2, name="down")(inputs)
    y = keras.layers.Conv2D(16, 7, padding="same", groups=16, name="depthwise")(x)
    y = keras.layers.LayerNormalization(epsilon=1e-6, name="block_ln")(y)
    y = keras.layers.Dense(16)(keras.layers.Dense(32, activation="gelu")(y))
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="out_ln")(keras.layers.Add()([x, y]))
    return randomise_norms(keras.Model(inputs, x))


def test_tf2onnx_s_own_optimizer_loop_keeps_the_transposes_at_1x1_too(monkeypatch, tmp_path):
    """The public path (`tf2onnx.convert.from_function`, taken when tf2onnx's private `_convert_common` takes no
    optimizers) runs the transpose optimizer without its size-1 Reshapes as well: the same right answer."""
    take_tf2onnx_public_path(monkeypatch)
    _check_last_layer_norm_at_1x1(_convnext_stage_at_1x1(), tmp_path / "stage.onnx")


def take_tf2onnx_public_path(monkeypatch) -> None:
    """tf2onnx's private `_convert_common` refuses the optimizers argument, as a tf2onnx without it would: the export
    then takes `tf2onnx.convert.from_function`'s public path (keras_internals.converted_with_optimizers)."""
    import tf2onnx.convert

    original = tf2onnx.convert._convert_common

    def without_optimizers(*args, optimizers=None, **kwargs):
        if optimizers is not None:
            raise TypeError("_convert_common() got an unexpected keyword argument 'optimizers'")
        return original(*args, **kwargs)

    monkeypatch.setattr(tf2onnx.convert, "_convert_common", without_optimizers)


def export_convnext_tiny_at_32(folder: str) -> None:
    """The model the issue names, whole (the body of the slow test, run in a child process)."""
    model = randomise_norms(keras.applications.ConvNeXtTiny(weights=None, input_shape=(32, 32, 3), include_top=False))
    _check_last_layer_norm_at_1x1(model, Path(folder) / "convnext_tiny.onnx")


@pytest.mark.slow
def test_convnext_tiny_at_32x32_as_the_issue_names_it(tmp_path):
    _in_a_child("export_convnext_tiny_at_32", tmp_path)


# --------------------------------------------------------------------------- 7. BatchNorms after separable convolutions


def _check_batchnorms_unfolded(model, path: Path) -> None:
    """Every BatchNorm a native BatchNormalization of the file holding the layer's own statistics and eps (34 of
    Xception's were refused, 'presence: a batch normalization / found none in the exported graph')."""
    result = export_for_serving(model, path)
    assert result.passed and result.written, result.failed_checks
    batchnorms = [layer for layer in all_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]
    assert any(type(layer).__name__ == "SeparableConv2D" for layer in all_layers(model))
    written = onnx.load(str(path))
    nodes = _norm_nodes(written, "BatchNormalization")
    assert len(nodes) == len(batchnorms)
    held = {tuple(_initializer(written, node.input[3]).round(6)) for node in nodes}  # each node's running mean
    assert held == {tuple(_variable(layer, "moving_mean").round(6)) for layer in batchnorms}
    checked = {v.setting for v in result.verification if v.source_layer == batchnorms[-1].name}
    assert checked >= {"eps", "running_mean", "running_var"}


def test_keras_hub_xception_s_batchnorms_after_separable_convolutions_are_unfolded(tmp_path):
    """Issue 34, item 7, in small config: keras_hub's XceptionBackbone, separable convolutions without a bias."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    model = keras_hub.models.XceptionBackbone(
        stackwise_conv_filters=[[8, 16], [16, 24], [24, 24], [32, 32]],
        stackwise_pooling=[True, True, False, False],
        image_shape=(32, 32, 3),
    )
    _check_batchnorms_unfolded(randomise_norms(model), tmp_path / "xception.onnx")


@pytest.mark.parametrize("bias", ["as built (zeros)", "trained"])
def test_a_separable_convolution_with_a_bias_and_a_depth_multiplier_unfolds_its_batchnorm(bias, tmp_path):
    """NASNet's and Xception's layer with what neither uses: a bias and a depth multiplier (the pointwise kernel reads
    C * 2 channels). TF folds the BatchNorm into the pointwise kernel when the bias is zero, and leaves it after a
    nonzero one; either way the file serves a native BatchNormalization and Keras's output."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 4))
    x = keras.layers.SeparableConv2D(6, 3, padding="same", depth_multiplier=2, name="separable")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    model = keras.Model(inputs, keras.layers.ReLU()(x))
    randomise_norms(model)
    if bias == "trained":
        model.get_layer("separable").bias.assign(np.linspace(-1, 1, 6).astype("float32"))
    _check_batchnorms_unfolded(model, tmp_path / "separable.onnx")
    x = np.random.default_rng(0).standard_normal((2, 8, 8, 4)).astype(np.float32)
    served = _run(tmp_path / "separable.onnx", {"input_0": x})[0]
    np.testing.assert_allclose(served, keras.ops.convert_to_numpy(model(x)), atol=1e-5)


def export_xception_at_71(folder: str) -> None:
    """The model the issue names, whole (the body of the slow test, run in a child process)."""
    model = randomise_norms(keras.applications.Xception(weights=None, input_shape=(71, 71, 3)))
    _check_batchnorms_unfolded(model, Path(folder) / "xception.onnx")


@pytest.mark.slow
def test_xception_at_71x71_as_the_issue_names_it(tmp_path):
    _in_a_child("export_xception_at_71", tmp_path)
