"""Serving contract: equality with the source in eval mode and batch independence, on real torch, keras and onnxruntime.

What torch 2.13's exporter does with a module in train mode (checked here, not assumed):
`torch.onnx.export(dynamo=True)` writes every BatchNorm as an inference BatchNormalization on
the running statistics (onnxscript's torch_lib forces `training = False`) and keeps Dropout
with training_mode=1. So a BatchNorm-only model exported in train mode serves the eval
function, while dropout left on makes the file random; a .pt2 traced in train mode keeps
`training=True` in its graph and computes batch statistics itself.
"""

from __future__ import annotations

import copy
import json
import logging
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from torch import nn
from typer.testing import CliRunner

from converters.models.serving.contract import contract_test
from converters.onnx_adapter.running import onnx_train_mode_nodes
from converters.models.serving.samples import InputSpec, load_sample, random_sample
from schemas import InputFileError

warnings.filterwarnings("ignore", message=".*training mode.*")
logging.getLogger("torch.onnx").setLevel(logging.ERROR)

BATCH = torch.export.Dim("batch", min=1, max=1024)


class SmallNet(nn.Module):
    """Conv-BN-ReLU, global average pool, optional dropout, Linear."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))))


def trained(dropout: float = 0.0) -> nn.Module:
    """A SmallNet whose BatchNorm statistics moved away from their initial values, left in train mode."""
    torch.manual_seed(0)
    model = SmallNet(dropout).train()
    with torch.no_grad():
        for _ in range(10):
            model(torch.randn(16, 3, 12, 12) * 2 + 1)
    return model


def to_onnx(model, *, dynamic: bool = True) -> onnx.ModelProto:
    example = (torch.randn(2, 3, 12, 12),) if dynamic else (torch.randn(4, 3, 12, 12),)
    shapes = ({0: BATCH},) if dynamic else None
    return torch.onnx.export(model, example, dynamo=True, dynamic_shapes=shapes, verbose=False).model_proto


def ort_outputs(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def attribute(node, name, default=None):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def test_train_mode_export_with_dropout_fails_both_tests_and_eval_export_passes():
    model = trained(dropout=0.3)
    exported = to_onnx(model.train())
    # The exporter's choices: no BatchNormalization in training mode anywhere, Dropout kept in training mode.
    assert not any(n.op_type == "BatchNormalization" and attribute(n, "training_mode", 0) for n in exported.graph.node)
    assert any("Dropout" in f and "training_mode=1" in f for f in onnx_train_mode_nodes(exported))

    failed = contract_test(model, exported)
    assert not failed.passed
    assert not failed.outputs[0].passed and failed.outputs[0].max_abs_error > 1e-2
    source, serving = failed.batch_independence
    assert source.passed and source.deterministic  # the contract replays a deep copy of the source in eval mode
    assert not serving.passed and not serving.deterministic
    assert any("train mode" in f for f in failed.findings)
    assert model.training and model.drop.training  # the caller's module is left as it was

    fixed = contract_test(model, to_onnx(model.eval()))
    assert fixed.passed, fixed.render_text()
    assert [b.method for b in fixed.batch_independence] == ["alone", "alone"]
    assert fixed.tolerances[0].dtype == "float32" and (fixed.tolerances[0].atol, fixed.tolerances[0].rtol) == (
        1e-4,
        1e-3,
    )


def test_errors_are_measured_against_numpy_on_the_same_sample():
    model = trained().eval()
    exported = to_onnx(model)
    result = contract_test(model, exported, batch_size=3, seed=7)
    x = random_sample([InputSpec("x", (None, 3, 12, 12), "float32")], batch_size=3, seed=7).arrays[0]
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy().astype(np.float64)
    diff = np.abs(ort_outputs(exported, x) - expected)
    assert result.sample.shapes == [[3, 3, 12, 12]] and result.sample.seed == 7
    assert result.outputs[0].max_abs_error == pytest.approx(float(diff.max()), rel=0, abs=0)
    assert result.passed


def test_batchnorm_only_model_exported_in_train_mode_serves_its_running_statistics():
    model = trained()
    exported = to_onnx(model.train())
    result = contract_test(model, exported)
    # Honest outcome: the exporter replaced batch statistics by running statistics, so the file
    # computes the eval function the contract asks for; only the finding tells the source was in train mode.
    assert result.passed, result.render_text()
    assert any("source module is in train mode" in f for f in result.findings)
    assert onnx_train_mode_nodes(exported) == []


def test_pt2_traced_in_train_mode_fails_both_tests_and_passes_traced_in_eval(tmp_path):
    model = trained()
    for mode, expect_pass in (("train", False), ("eval", True)):
        getattr(model, mode)()
        program = torch.export.export(model, (torch.randn(2, 3, 12, 12),), dynamic_shapes=({0: BATCH},))
        torch.export.save(program, tmp_path / f"{mode}.pt2")
        loaded = torch.export.load(tmp_path / f"{mode}.pt2")
        serving = torch.onnx.export(loaded, dynamo=True, verbose=False).model_proto
        result = contract_test(loaded, serving)
        assert result.passed is expect_pass, result.render_text()
        if not expect_pass:
            assert not result.outputs[0].passed
            source, served = result.batch_independence
            assert not source.passed and source.deterministic and "batch statistics" in source.reason
            assert served.passed  # the exporter wrote running statistics: the file itself is batch independent
            assert any("training=True" in f for f in result.findings)


def test_fixed_batch_export_uses_replaced_neighbours():
    model = trained().eval()
    exported = to_onnx(model, dynamic=False)
    assert exported.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 4
    result = contract_test(model, exported, batch_size=2)  # the fixed batch of 4 wins over the requested 2
    assert result.sample.shapes[0][0] == 4
    assert [b.method for b in result.batch_independence] == ["alone", "replaced"]
    assert result.passed, result.render_text()


def test_an_onnx_batchnorm_in_training_mode_fails_batch_independence():
    model = trained().eval()
    exported = to_onnx(model)
    graph = copy.deepcopy(exported)  # append a training_mode=1 BatchNormalization on the logits
    out = graph.graph.output[0].name
    graph.graph.node.append(
        helper.make_node("BatchNormalization", [out, "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1)
    )
    graph.graph.initializer.extend(
        numpy_helper.from_array(np.array(v, np.float32), n)
        for n, v in (("s", [1] * 3), ("b", [0] * 3), ("m", [0] * 3), ("v", [1] * 3))
    )
    del graph.graph.output[:]
    graph.graph.output.append(helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None))
    result = contract_test(model, graph)
    assert not result.passed
    serving = result.batch_independence[1]
    assert not serving.passed and serving.deterministic
    assert any("training_mode=1" in f for f in result.findings)


@pytest.fixture(scope="module")
def keras_pair(tmp_path_factory):
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((10, 10, 3), name="image")
    x = keras.layers.Conv2D(6, 3, padding="same")(inputs)
    x = keras.layers.BatchNormalization(epsilon=1e-3)(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.LayerNormalization(epsilon=1e-4)(x)
    outputs = keras.layers.Dense(4)(x)
    model = keras.Model(inputs, outputs, name="small_keras")
    bn = model.layers[2]
    bn.moving_mean.assign(np.linspace(-0.5, 0.5, 6).astype(np.float32))
    bn.moving_variance.assign(np.linspace(0.5, 2.0, 6).astype(np.float32))
    model(np.zeros((1, 10, 10, 3), np.float32), training=False)
    path = tmp_path_factory.mktemp("keras") / "small.onnx"
    model.export(str(path), format="onnx", verbose=False)
    return model, onnx.load(str(path))


def test_keras_model_and_its_tf2onnx_export_agree_channels_last(keras_pair, tmp_path):
    model, exported = keras_pair
    dims = [d.dim_value or None for d in exported.graph.input[0].type.tensor_type.shape.dim]
    assert dims[1:] == [10, 10, 3]  # tf2onnx keeps Keras's channels-last input
    np.savez(tmp_path / "requests.npz", image=np.random.default_rng(3).uniform(0, 1, (5, 10, 10, 3)).astype(np.float64))
    result = contract_test(model, exported, sample=tmp_path / "requests.npz")
    assert result.passed, result.render_text()
    assert result.sample.shapes == [[5, 10, 10, 3]] and result.sample.dtypes == ["float32"]
    np.save(tmp_path / "nchw.npy", np.zeros((2, 3, 10, 10), np.float32))
    with pytest.raises(InputFileError, match="channels-last"):
        contract_test(model, exported, sample=tmp_path / "nchw.npy")


def test_keras_export_of_different_weights_fails_equality_only(keras_pair):
    import keras

    model, exported = keras_pair
    other = keras.models.clone_model(model)
    other.set_weights([w + 0.05 for w in model.get_weights()])
    result = contract_test(other, exported)
    assert not result.passed and not result.outputs[0].passed
    assert all(b.passed for b in result.batch_independence)


def test_sample_files_are_never_unpickled(tmp_path):
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InputFileError, match="unpickling"):
        load_sample(tmp_path / "objects.npy")
    np.savez(tmp_path / "two.npz", b=np.ones((2, 4), np.float32), a=np.zeros((2, 3), np.float32))
    specs = [InputSpec("a", (None, 3), "float32"), InputSpec("b", (None, 4), "float32")]
    sample = load_sample(tmp_path / "two.npz", specs)
    assert sample.names == ("a", "b") and sample.arrays[0].shape == (2, 3)
    again = random_sample(specs, batch_size=2, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(again.arrays, random_sample(specs, batch_size=2, seed=5).arrays))
    assert "cast" not in sample.description  # stored in the inputs' own dtype


def test_a_sample_cast_to_the_models_input_dtype_says_so(tmp_path):
    """int64 pixels in a .npy for a float32 model are cast (the model takes nothing else),
    and the description says it."""
    np.save(tmp_path / "ints.npy", np.arange(24, dtype=np.int64).reshape(2, 3, 4))
    sample = load_sample(tmp_path / "ints.npy", [InputSpec("x", (None, 3, 4), "float32")])
    assert sample.arrays[0].dtype == np.float32 and np.array_equal(sample.arrays[0], np.arange(24).reshape(2, 3, 4))
    assert "float32[2, 3, 4] (cast from the file's int64)" in sample.description


def test_cli_contract_exit_codes_json_and_table(tmp_path, cli_app):
    model = trained()
    paths = {}
    for mode in ("train", "eval"):
        getattr(model, mode)()
        program = torch.export.export(model, (torch.randn(2, 3, 12, 12),), dynamic_shapes=({0: BATCH},))
        torch.export.save(program, tmp_path / f"{mode}.pt2")
        onnx.save(torch.onnx.export(program, dynamo=True, verbose=False).model_proto, tmp_path / f"{mode}.onnx")
        paths[mode] = (str(tmp_path / f"{mode}.pt2"), str(tmp_path / f"{mode}.onnx"))
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((3, 3, 12, 12)).astype(np.float32))
    runner = CliRunner()
    ok = runner.invoke(cli_app, ["contract", *paths["eval"], "--sample", str(tmp_path / "x.npy"), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["passed"] is True and json.loads(ok.output)["sample"]["shapes"] == [[3, 3, 12, 12]]
    bad = runner.invoke(cli_app, ["contract", *paths["train"]])
    assert bad.exit_code == 7
    assert "MISMATCH" in bad.output and "batch independence" in bad.output and "contract FAILED" in bad.output
    (tmp_path / "model.pt").write_bytes(b"\x80\x04N.")
    pickled = runner.invoke(cli_app, ["contract", str(tmp_path / "model.pt"), paths["eval"][1]])
    assert pickled.exit_code == 6
