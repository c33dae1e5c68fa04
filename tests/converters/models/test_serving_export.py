"""Export for serving: native normalization ops with the source's exact eps and statistics, verified,
contract-tested, refused on failure.

The Keras claim (no other tool does it): a keras.applications MobileNetV2 (weights=None,
statistics randomized so every layer differs) exported through Keras's own tf2onnx export
holds one native BatchNormalization per source layer, with eps and statistics bit-equal to
the source, although tf2onnx (TF's grappler) had folded them into Conv kernels and Mul/Add.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from torch import nn
from typer.testing import CliRunner

from converters.onnx_adapter.graph.sites import find_norm_sites
from converters.models.serving.samples import as_sample
from converters.models.serving.export import (
    export_for_serving,
    source_specs,
    verify_sites,
)
from schemas import CheckFailedError

warnings.filterwarnings("ignore", message=".*(LeafSpec|training mode).*")
logging.getLogger("torch.onnx").setLevel(logging.ERROR)

BATCH = torch.export.Dim("batch", min=1, max=1024)
NORM_OPS = ("BatchNormalization", "GroupNormalization", "LayerNormalization", "RMSNormalization")
#: Both test models use these eps (float32, as ONNX stores them).
EXPECTED_EPS = {op: float(np.float32(eps)) for op, eps in zip(NORM_OPS, (1e-3, 1e-4, 1e-6, 1e-5))}


class Mixed(nn.Module):
    """One of each kind, each with its own eps, BatchNorm statistics trained away from their initial values."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8, eps=1e-3)
        self.gn = nn.GroupNorm(2, 8, eps=1e-4)
        self.drop = nn.Dropout(0.25)
        self.ln = nn.LayerNorm(8, eps=1e-6)
        self.rms = nn.RMSNorm(8, eps=1e-5)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        y = self.gn(torch.relu(self.bn(self.conv(x)))).mean(dim=(2, 3))
        return self.head(self.rms(self.ln(self.drop(y))))


@pytest.fixture(scope="module")
def mixed() -> nn.Module:
    torch.manual_seed(0)
    model = Mixed().train()
    with torch.no_grad():
        for _ in range(5):
            model(torch.randn(16, 3, 10, 10) * 1.5 + 0.5)
    return model.eval()


def sample(n: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 10, 10)).astype(np.float32)


def attribute(node, name, default=None):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def test_torch_export_has_native_ops_with_exact_eps_and_statistics(mixed, tmp_path):
    path = tmp_path / "mixed.onnx"
    result = export_for_serving(mixed, path, opset=23, sample=sample())
    assert result.passed and result.written and result.path == str(path) and not result.forced
    model = onnx.load(str(path))
    norm_nodes = [n for n in model.graph.node if n.op_type in NORM_OPS]
    assert [n.op_type for n in norm_nodes] == list(NORM_OPS)  # BatchNorm not folded into the Conv
    eps = {n.op_type: attribute(n, "epsilon") for n in norm_nodes}
    assert eps == EXPECTED_EPS
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    bn = norm_nodes[0]
    assert initializers[bn.input[3]].tobytes() == mixed.bn.running_mean.numpy().tobytes()
    assert initializers[bn.input[4]].tobytes() == mixed.bn.running_var.numpy().tobytes()
    assert all(v.passed for v in result.verification)
    assert {v.setting for v in result.verification} >= {"eps", "running_mean", "running_var", "mode"}
    assert result.contract.passed and result.contract.outputs[0].max_abs_error < 1e-5


def test_verification_catches_a_changed_eps_and_statistics(mixed, tmp_path):
    x = sample()
    export_for_serving(mixed, tmp_path / "m.onnx", sample=x)
    model = onnx.load(str(tmp_path / "m.onnx"))
    specs = source_specs(mixed, as_sample(x, None))
    assert verify_sites(specs, find_norm_sites(model)) and all(
        v.passed for v in verify_sites(specs, find_norm_sites(model))
    )
    for node in model.graph.node:
        if node.op_type == "LayerNormalization":
            for a in node.attribute:
                if a.name == "epsilon":
                    a.f = 1e-5  # the PyTorch default instead of the source's 1e-6
        if node.op_type == "BatchNormalization":
            var = next(t for t in model.graph.initializer if t.name == node.input[4])
            var.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(var) * np.float32(1.0001), var.name))
    failed = {(v.source_layer, v.setting): v for v in verify_sites(specs, find_norm_sites(model)) if not v.passed}
    assert set(failed) == {("ln", "eps"), ("bn", "running_var")}
    assert failed[("ln", "eps")].expected == "1e-06" and failed[("ln", "eps")].found == "1e-05"


def test_train_mode_source_is_refused_unless_forced(mixed, tmp_path):
    import copy

    training = copy.deepcopy(mixed).train()
    path = tmp_path / "train.onnx"
    with pytest.raises(CheckFailedError, match="nothing written") as refused:
        export_for_serving(training, path, sample=sample())
    assert not path.exists() and list(tmp_path.iterdir()) == []
    result = refused.value.result
    assert not result.written and result.path is None
    assert [(v.source_layer, v.setting) for v in result.failed_checks] == [("bn", "mode")]
    assert not result.contract.passed  # dropout left on: the file drops activations at random
    forced = export_for_serving(training, path, sample=sample(), force=True)
    assert path.exists() and forced.written and forced.forced and not forced.passed


def test_dropout_left_on_fails_the_contract_alone(mixed, tmp_path):
    import copy

    model = copy.deepcopy(mixed)
    model.drop.train()
    with pytest.raises(CheckFailedError, match="serving contract failed") as refused:
        export_for_serving(model, tmp_path / "d.onnx", sample=sample())
    result = refused.value.result
    assert all(v.passed for v in result.verification)
    assert not result.contract.batch_independence[1].deterministic


@pytest.fixture(scope="module")
def mobilenet():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10)
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.moving_mean.shape[0]
            layer.moving_mean.assign(rng.normal(0, 0.2, c).astype(np.float32))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, c).astype(np.float32))
            layer.gamma.assign(rng.uniform(0.5, 1.5, c).astype(np.float32))
            layer.beta.assign(rng.normal(0, 0.1, c).astype(np.float32))
    return model


def test_keras_applications_export_has_native_batchnorm_with_exact_eps_and_statistics(mobilenet, tmp_path):
    import keras

    path = tmp_path / "mobilenet.onnx"
    result = export_for_serving(mobilenet, path)
    assert result.passed and result.written, result.render_text()
    model = onnx.load(str(path))
    layers = [l for l in mobilenet.layers if isinstance(l, keras.layers.BatchNormalization)]
    nodes = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert len(nodes) == len(layers) == 52
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    in_file = {tuple(initializers[name].tobytes() for name in n.input[1:5]) for n in nodes}
    for layer in layers:  # each source layer has a node with bit-identical scale, bias, mean and variance
        state = tuple(
            keras.ops.convert_to_numpy(w).tobytes()
            for w in (layer.gamma, layer.beta, layer.moving_mean, layer.moving_variance)
        )
        assert state in in_file, layer.name
    assert {attribute(n, "epsilon") for n in nodes} == {float(np.float32(layers[0].epsilon))} and layers[
        0
    ].epsilon == 1e-3
    assert not any(attribute(n, "training_mode", 0) for n in nodes)
    assert len(result.rewritten) == 52 and sum(v.setting == "eps" for v in result.verification) == 52
    assert result.contract.passed and result.contract.sample.shapes == [
        [4, 32, 32, 3]
    ]  # channels-last, as Keras and tf2onnx take it


@pytest.fixture(scope="module")
def small_keras():
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 12, 3), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    x = keras.layers.BatchNormalization(epsilon=1e-3, name="bn")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GroupNormalization(groups=2, epsilon=1e-4, name="gn")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="ln")(x)
    x = keras.layers.RMSNormalization(epsilon=1e-5, name="rms")(x)
    model = keras.Model(inputs, keras.layers.Dense(3)(x), name="small")
    bn = model.get_layer("bn")
    bn.moving_mean.assign(np.linspace(-1, 1, 8).astype(np.float32))
    bn.moving_variance.assign(np.linspace(0.5, 2, 8).astype(np.float32))
    bn.beta.assign(np.full(8, 0.1, np.float32))
    return model


def test_keras_layer_group_rms_become_native_where_the_opset_allows(small_keras, tmp_path):
    high = export_for_serving(small_keras, tmp_path / "23.onnx", opset=23)
    ops = Counter(n.op_type for n in onnx.load(str(tmp_path / "23.onnx")).graph.node)
    assert all(ops[op] == 1 for op in NORM_OPS) and high.opset == 23
    eps = {
        n.op_type: attribute(n, "epsilon")
        for n in onnx.load(str(tmp_path / "23.onnx")).graph.node
        if n.op_type in NORM_OPS
    }
    assert eps == EXPECTED_EPS
    low = export_for_serving(small_keras, tmp_path / "18.onnx", opset=18)
    ops = Counter(n.op_type for n in onnx.load(str(tmp_path / "18.onnx")).graph.node)
    assert (
        low.opset == 18
        and ops["LayerNormalization"] == 1
        and ops["GroupNormalization"] == 0
        and ops["RMSNormalization"] == 0
    )
    assert {v.source_layer for v in low.verification if v.setting == "eps"} == {
        "bn",
        "gn",
        "ln",
        "rms",
    }  # decompositions verified by eps
    assert low.passed


def test_keras_without_rewrite_is_refused_because_eps_is_folded_away(small_keras, tmp_path):
    with pytest.raises(CheckFailedError) as refused:
        export_for_serving(small_keras, tmp_path / "raw.onnx", rewrite=False)
    result = refused.value.result
    assert not (tmp_path / "raw.onnx").exists()
    assert result.contract.passed  # the function is right; what is lost is the BatchNorm's eps and statistics
    assert any(v.source_layer == "bn" and not v.passed for v in result.verification)


def test_cli_export_pt2(mixed, tmp_path, cli_app):
    for mode in ("eval", "train"):
        getattr(mixed, mode)()
        program = torch.export.export(mixed, (torch.from_numpy(sample(2)),), dynamic_shapes=({0: BATCH},))
        torch.export.save(program, tmp_path / f"{mode}.pt2")
    mixed.eval()
    runner = CliRunner()
    done = runner.invoke(
        cli_app, ["export", str(tmp_path / "eval.pt2"), "--to", "onnx", "-o", str(tmp_path / "eval.onnx"), "--json"]
    )
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["passed"] and report["written"] and report["contract"]["passed"]
    assert (tmp_path / "eval.onnx").exists()
    refused = runner.invoke(
        cli_app, ["export", str(tmp_path / "train.pt2"), "--to", "onnx", "-o", str(tmp_path / "train.onnx")]
    )
    assert refused.exit_code == 7 and not (tmp_path / "train.onnx").exists()
    assert "refused" in refused.output and "mode" in refused.output
    forced = runner.invoke(
        cli_app, ["export", str(tmp_path / "train.pt2"), "-o", str(tmp_path / "train.onnx"), "--force", "--json"]
    )
    assert forced.exit_code == 0 and (tmp_path / "train.onnx").exists()
    assert json.loads(forced.output)["forced"] is True and json.loads(forced.output)["passed"] is False


def test_keras_conv_with_bias_and_fresh_batchnorm_is_unfolded_to_native(tmp_path):
    """Fresh statistics and a zero conv bias fold to a zero offset, whose Add tf2onnx drops
    (keras.applications ResNet50)."""
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((10, 10, 3))
    x = keras.layers.Conv2D(6, 3, use_bias=True, name="conv")(inputs)
    x = keras.layers.BatchNormalization(epsilon=1.001e-5, name="fresh_bn")(x)
    x = keras.layers.ReLU()(x)
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))
    path = tmp_path / "fresh.onnx"
    result = export_for_serving(model, path)
    assert result.passed and result.written, result.render_text()
    nodes = [n for n in onnx.load(str(path)).graph.node if n.op_type == "BatchNormalization"]
    assert len(nodes) == 1 and attribute(nodes[0], "epsilon") == float(np.float32(1.001e-5))


def test_an_exported_graph_onnxruntime_cannot_run_is_an_unsupported_object_naming_the_op_not_a_bad_input_file():
    """What `export --opset 26` met on a transformers Llama: the exporter's graph held Attention at an opset onnxruntime
    has no kernel for. That is not the user's file (exit 6), it is the export (exit 5),
    and the message says the opset to use."""
    from converters.models.serving.export import _contract
    from schemas import UnsupportedObjectError

    class Add(nn.Module):
        def forward(self, q, k, v):
            return q + k + v

    example = tuple(torch.randn(1, 2, 3, 4) for _ in range(3))
    source = torch.export.export(Add(), example)
    inputs = [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, 2, 3, 4]) for name in ("q", "k", "v")]
    graph = helper.make_graph(
        [helper.make_node("Attention", ["q", "k", "v"], ["y"])],
        "g",
        inputs,
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 3, 4])],
    )
    final = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])  # Attention exists from opset 23
    final.ir_version = 10
    with pytest.raises(
        UnsupportedObjectError, match=r"uses Attention at opset 18, which onnxruntime .* cannot run.*lower --opset"
    ):
        _contract(source, final, None, None, [])


class DeadNorm(nn.Module):
    """LayerNorm `pooler` computed but its result unused (a pooler output the model does not return):
    dead code torch.onnx drops."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.first = nn.LayerNorm(8, eps=1e-3)
        self.pooler = nn.LayerNorm(8, eps=1e-4)
        self.last = nn.LayerNorm(8, eps=1e-6)

    def forward(self, x):
        y = self.last(self.first(self.linear(x)))
        _ = self.pooler(y)
        return y


@pytest.mark.parametrize("as_program", [True, False], ids=["pt2", "module"])
def test_a_dead_norm_is_reported_not_checked_and_the_layers_in_the_graph_are_checked(tmp_path, as_program):
    import onnxruntime as ort

    torch.manual_seed(0)
    model = DeadNorm().eval()
    with torch.no_grad():
        for layer in (model.first, model.pooler, model.last):
            layer.weight.normal_()
            layer.bias.normal_()
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    source = torch.export.export(model, (torch.from_numpy(x),)) if as_program else model
    path = tmp_path / "dead.onnx"
    result = export_for_serving(source, path, sample=x)
    assert result.passed and result.written, result.render_text()
    checked = {v.source_layer: v.found for v in result.verification if v.setting == "eps"}
    assert checked == {"first": "0.001", "last": "1e-06"}
    dead = [v for v in result.verification if v.source_layer == "pooler"]
    assert [(v.setting, v.passed, v.found) for v in dead] == [
        ("presence", True, "none in the exported graph (not checked)")
    ]
    assert "dead code" in dead[0].note and any("pooler" in note and "not checked" in note for note in result.notes)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(
        session.run(None, {session.get_inputs()[0].name: x})[0], model(torch.from_numpy(x)).detach().numpy(), atol=1e-5
    )

    specs = source_specs(source, as_sample(x, None))
    sites = find_norm_sites(onnx.load(str(path)))
    assert ("pooler", "presence", False) in [
        (v.source_layer, v.setting, v.passed) for v in verify_sites(specs, sites)
    ]  # unknown dead: fails
    tampered = onnx.load(str(path))
    node = [n for n in tampered.graph.node if n.op_type == "LayerNormalization"][1]
    next(a for a in node.attribute if a.name == "epsilon").f = 1e-5
    failed = verify_sites(specs, find_norm_sites(tampered), unused=frozenset({"pooler"}))
    assert [(v.source_layer, v.setting) for v in failed if not v.passed] == [("last", "eps")]


def test_an_eval_instance_norm_with_running_statistics_is_checked_as_the_batchnormalization_it_is_served_as(tmp_path):
    """torch.onnx writes an eval InstanceNorm2d(track_running_stats=True) as a BatchNormalization over the (1, N*C, H,
    W) view, its statistics and affine repeated N times: it pairs with that node (its neighbouring BatchNorms keep
    theirs), each repetition is compared with the source, and one changed value still fails."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3),
        nn.BatchNorm2d(6, eps=0.3, affine=False),
        nn.InstanceNorm2d(6, affine=True, track_running_stats=True, eps=0.05),
        nn.GroupNorm(2, 6, eps=0.02),
        nn.BatchNorm2d(6, eps=1e-3),
    )
    with torch.no_grad():
        for layer in (model[1], model[2], model[4]):
            layer.running_mean.normal_()
            layer.running_var.uniform_(0.5, 2)
        for layer in (model[2], model[3], model[4]):
            layer.weight.normal_()
            layer.bias.normal_()
    model.eval()
    x = sample(2)
    path = tmp_path / "in.onnx"
    result = export_for_serving(torch.export.export(model, (torch.from_numpy(x),)), path, sample=x)
    assert result.passed and result.written, result.render_text()
    assert {v.source_layer: v.found for v in result.verification if v.setting == "eps"} == {
        "1": "0.3",
        "2": "0.05",
        "3": "0.02",
        "4": "0.001",
    }
    assert {v.setting for v in result.verification if v.source_layer == "2"} == {
        "eps",
        "running_mean",
        "running_var",
        "scale",
        "bias",
        "mode",
    }
    assert result.contract.passed and result.contract.outputs[0].max_abs_error < 1e-5

    tampered = onnx.load(str(path))
    node = next(
        n
        for n in tampered.graph.node
        if n.op_type == "BatchNormalization"
        and n.input[0] != "conv2d"
        and numpy_helper.to_array(next(t for t in tampered.graph.initializer if t.name == n.input[3])).size == 12
    )
    var = next(t for t in tampered.graph.initializer if t.name == node.input[4])
    values = numpy_helper.to_array(var).copy()
    values[7] *= np.float32(1.0001)  # the second request's copy of channel 1
    var.CopyFrom(numpy_helper.from_array(values, var.name))
    specs = source_specs(torch.export.export(model, (torch.from_numpy(x),)))
    failed = [(v.source_layer, v.setting) for v in verify_sites(specs, find_norm_sites(tampered)) if not v.passed]
    assert failed == [("2", "running_var")]
