"""Recalibration: new BatchNorm statistics are the population statistics of the data; nothing else changes.

The torch, .pt2 and ONNX paths must agree, and the first layer's numbers are recomputed with NumPy
from its convolution's output (test_recalibration_population.py holds every layer to a NumPy oracle).
"""

from __future__ import annotations

import json
import logging
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn
from typer.testing import CliRunner

from converters.models.serving.contract import contract_test
from converters.models.monitoring.recalibration import recalibrate
from schemas import InputFileError, UnsupportedObjectError

warnings.filterwarnings("ignore", message=".*LeafSpec.*")
logging.getLogger("torch.onnx").setLevel(logging.ERROR)

BATCH = torch.export.Dim("batch", min=1, max=1024)
BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def images(n: int, seed: int, means=(0.5, 0.4, 0.3), std: float = 0.2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 3, 12, 12)) * std + np.asarray(means)[None, :, None, None]).astype(np.float32)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8, momentum=0.05), nn.ReLU())
        self.block = nn.Sequential(
            nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8, eps=1e-3), nn.ReLU(), nn.Dropout(0.5)
        )
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.block(self.stem(x)).mean(dim=(2, 3)))


@pytest.fixture(scope="module")
def source() -> nn.Module:
    return Net().eval()


@pytest.fixture(scope="module")
def batches() -> list[np.ndarray]:
    return [images(16, seed=s) for s in range(3)]


@pytest.fixture(scope="module")
def by_torch(source, batches):
    return recalibrate(source, batches)


def test_torch_statistics_are_the_population_statistics_and_nothing_else_moves(source, batches, by_torch):
    new, report = by_torch
    conv, bn = source.stem[0], new.stem[1]
    with torch.no_grad():
        z = conv(torch.from_numpy(np.concatenate(batches))).double().numpy()
    expected_mean = z.mean(axis=(0, 2, 3))
    expected_var = z.var(axis=(0, 2, 3), ddof=1)  # over all 48 samples together, not an average of per-batch variances
    np.testing.assert_allclose(bn.running_mean.numpy(), expected_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), expected_var, rtol=1e-5)
    assert int(bn.num_batches_tracked) == 3
    # Every parameter (BatchNorm affine included) and every non-statistic buffer is bit-identical.
    for name, parameter in source.named_parameters():
        assert torch.equal(parameter, new.get_parameter(name)), name
    # The source is untouched; momentum and modes are restored on the copy.
    assert torch.equal(source.stem[1].running_mean, torch.zeros(8)) and int(source.stem[1].num_batches_tracked) == 0
    assert (new.stem[1].momentum, new.block[1].momentum) == (0.05, 0.1)
    assert not any(m.training for m in new.modules())
    # The report measures the movement against the old statistics (mean 0, var 1).
    first = report.layers[0]
    assert [l.name for l in report.layers] == ["stem.1", "block.1"] and report.batches == 3 and report.samples == 48
    assert first.max_mean_shift == pytest.approx(
        np.max(np.abs(bn.running_mean.double().numpy()) / np.sqrt(1 + 1e-5)), rel=1e-9
    )
    assert first.max_abs_log_var_ratio == pytest.approx(
        np.max(np.abs(np.log((bn.running_var.double().numpy() + 1e-5) / (1 + 1e-5)))), rel=1e-9
    )
    assert not report.registered and not any("registry" in note for note in report.notes)


def test_dropout_stays_off_during_recalibration(source, batches, by_torch):
    # With dropout active the second layer's input would be random; run twice, same statistics.
    again, _ = recalibrate(source, batches)
    assert torch.equal(again.block[1].running_var, by_torch[0].block[1].running_var)


def test_onnx_recalibration_matches_torch_and_changes_only_statistics(source, batches, by_torch):
    new_torch, _ = by_torch
    exported = torch.onnx.export(
        source,
        (torch.from_numpy(batches[0][:2]),),
        dynamo=True,
        dynamic_shapes=({0: BATCH},),
        optimize=False,
        verbose=False,
    ).model_proto
    new_onnx, report = recalibrate(exported, batches)
    before = {i.name: numpy_helper.to_array(i) for i in exported.graph.initializer}
    after = {i.name: numpy_helper.to_array(i) for i in new_onnx.graph.initializer}
    assert before.keys() == after.keys()
    for name, value in after.items():
        if name.endswith((".running_mean", ".running_var")):
            expected = new_torch.get_buffer(name).numpy()
            np.testing.assert_allclose(value, expected, rtol=2e-6, atol=1e-7, err_msg=name)
        else:
            assert value.tobytes() == before[name].tobytes(), name
    assert [n.SerializeToString() for n in new_onnx.graph.node] == [n.SerializeToString() for n in exported.graph.node]
    assert [l.name for l in report.layers] == ["stem.1", "block.1"] and report.framework == "onnx"
    assert contract_test(new_torch, new_onnx).passed


def test_pt2_recalibration_updates_only_the_state_dict(source, batches, by_torch):
    new_torch, _ = by_torch
    program = torch.export.export(source, (torch.from_numpy(batches[0][:2]),), dynamic_shapes=({0: BATCH},))
    new_program, report = recalibrate(program, batches)
    for name, value in new_program.state_dict.items():
        if name.endswith(BN_BUFFERS):
            np.testing.assert_allclose(
                value.double().numpy(), new_torch.get_buffer(name).double().numpy(), rtol=2e-6, atol=1e-7, err_msg=name
            )
        else:
            assert torch.equal(value, program.state_dict[name]), name
    assert torch.equal(program.state_dict["stem.1.running_var"], torch.ones(8))  # the input program is untouched
    assert str(new_program.graph) == str(program.graph)
    assert "graph unchanged" in report.method


def test_a_fixed_batch_program_is_split_at_its_size_and_the_report_says_so_when_another_was_asked(source, batches):
    """A .pt2 exported with a static batch of 4 takes no other; split at 4 its statistics are still those of all the
    data (the module recalibrated in one batch of 48), and the report notes that the 16 asked for was not used."""
    program = torch.export.export(source, (torch.from_numpy(batches[0][:4]),))
    data = np.concatenate(batches)
    new_program, report = recalibrate(program, data, batch_size=16)
    expected, _ = recalibrate(source, [data])
    np.testing.assert_allclose(
        new_program.state_dict["stem.1.running_var"].numpy(),
        expected.get_buffer("stem.1.running_var").numpy(),
        rtol=2e-6,
        atol=1e-7,
    )
    assert report.batches == len(data) // 4
    [note] = report.notes
    assert "batches of exactly 4" in note and "not 16" in note and "note: " + note in report.render_text()
    _, asked_four = recalibrate(program, data, batch_size=4)
    assert asked_four.notes == []


def test_refusals(source, batches):
    with pytest.raises(InputFileError, match="variance_estimator"):
        recalibrate(source, batches, variance_estimator="sample")
    dense = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).eval()
    exported = torch.onnx.export(
        dense, (torch.randn(2, 4),), dynamo=True, dynamic_shapes=({0: BATCH},), optimize=False, verbose=False
    ).model_proto
    with pytest.raises(InputFileError, match="at least 2"):
        recalibrate(exported, [np.ones((1, 4), np.float32)])
    with pytest.raises(UnsupportedObjectError, match="no BatchNorm"):
        recalibrate(nn.Sequential(nn.Conv2d(3, 3, 1)).eval(), batches)


def test_cli_recalibrate_onnx_and_pt2(source, batches, tmp_path, cli_app):
    onnx.save(
        torch.onnx.export(
            source,
            (torch.from_numpy(batches[0][:2]),),
            dynamo=True,
            dynamic_shapes=({0: BATCH},),
            optimize=False,
            verbose=False,
        ).model_proto,
        tmp_path / "net.onnx",
    )
    torch.export.save(
        torch.export.export(source, (torch.from_numpy(batches[0][:2]),), dynamic_shapes=({0: BATCH},)),
        tmp_path / "net.pt2",
    )
    np.save(tmp_path / "new.npy", np.concatenate(batches))
    runner = CliRunner()
    done = runner.invoke(
        cli_app,
        [
            "recalibrate",
            str(tmp_path / "net.onnx"),
            str(tmp_path / "new.npy"),
            "-o",
            str(tmp_path / "out.onnx"),
            "--batch-size",
            "16",
            "--json",
        ],
    )
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["batches"] == 3 and report["output"] == str(tmp_path / "out.onnx") and len(report["layers"]) == 2
    expected, _ = recalibrate(onnx.load(tmp_path / "net.onnx"), batches)
    written = onnx.load(tmp_path / "out.onnx")
    assert [i.SerializeToString() for i in written.graph.initializer] == [
        i.SerializeToString() for i in expected.graph.initializer
    ]
    text = runner.invoke(
        cli_app,
        [
            "recalibrate",
            str(tmp_path / "net.pt2"),
            str(tmp_path / "new.npy"),
            "-o",
            str(tmp_path / "out.pt2"),
            "--batch-size",
            "16",
        ],
    )
    assert text.exit_code == 0, text.output
    assert "stem.1" in text.output and "wrote" in text.output
    loaded = torch.export.load(tmp_path / "out.pt2")
    assert int(loaded.state_dict["block.1.num_batches_tracked"]) == 3
    wrong = runner.invoke(
        cli_app,
        ["recalibrate", str(tmp_path / "net.pt2"), str(tmp_path / "new.npy"), "-o", str(tmp_path / "other.onnx")],
    )
    assert wrong.exit_code == 6 and not (tmp_path / "other.onnx").exists()


def _keras_cnn(with_dropout: bool = False):
    import keras

    keras.utils.set_random_seed(3)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, use_bias=False, name="conv1")(inputs)
    x = keras.layers.BatchNormalization(name="bn1")(x)
    x = keras.layers.ReLU()(x)
    if with_dropout:
        x = keras.layers.Dropout(0.5)(x)
    x = keras.layers.Conv2D(5, 3, name="conv2")(x)
    x = keras.layers.BatchNormalization(name="bn2")(x)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))


def test_keras_statistics_are_the_population_statistics_and_weights_stay(tmp_path):
    import keras

    model = _keras_cnn()
    rng = np.random.default_rng(5)
    batches = [rng.normal(0.5, 2.0, (6, 8, 8, 3)).astype(np.float32) for _ in range(3)]
    before = [w.copy() for w in model.get_weights()]
    new, report = recalibrate(model, batches)
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before))  # the input model is untouched
    # bn1's input is conv1's output: its statistics over all 18 samples, checked in NumPy
    conv1 = keras.Model(model.input, model.get_layer("conv1").output)
    out = np.concatenate([np.asarray(conv1(b), np.float64).reshape(-1, 4) for b in batches])
    n = out.shape[0]
    expected_mean = out.mean(0)
    expected_var = out.var(0) * n / (n - 1)
    bn1 = new.get_layer("bn1")
    np.testing.assert_allclose(bn1.moving_mean.numpy(), expected_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn1.moving_variance.numpy(), expected_var, rtol=1e-5, atol=1e-6)
    assert bn1.momentum == model.get_layer("bn1").momentum  # untouched
    for name in ("conv1", "conv2"):  # weights untouched
        for a, b in zip(new.get_layer(name).get_weights(), model.get_layer(name).get_weights()):
            assert np.array_equal(a, b)
    assert {layer.name for layer in report.layers} == {"bn1", "bn2"} and report.layers[0].max_mean_shift > 0


def test_keras_dropout_stays_off_during_recalibration():
    """Recalibration reads the layers in eval mode (training=False): a Dropout between two BatchNorms changes
    nothing."""
    with_dropout, plain = _keras_cnn(with_dropout=True), _keras_cnn()
    plain.set_weights(with_dropout.get_weights())
    batches = [np.random.default_rng(6).normal(0.5, 2.0, (6, 8, 8, 3)).astype(np.float32) for _ in range(2)]
    first, _ = recalibrate(with_dropout, batches)
    again, _ = recalibrate(with_dropout, batches)
    expected, _ = recalibrate(plain, batches)
    for model in (again, expected):
        np.testing.assert_array_equal(
            first.get_layer("bn2").moving_variance.numpy(), model.get_layer("bn2").moving_variance.numpy()
        )


@pytest.mark.slow
def test_cli_recalibrate_keras_file(tmp_path):
    """The real console script on a .keras file: writes a .keras whose statistics moved and weights did not."""
    import subprocess
    import sys
    from pathlib import Path

    import keras

    model = _keras_cnn()
    source = tmp_path / "cnn.keras"
    model.save(source)
    data = tmp_path / "new.npy"
    np.save(data, np.random.default_rng(9).normal(1.0, 2.0, (12, 8, 8, 3)).astype(np.float32))
    out = tmp_path / "cnn.recalibrated.keras"
    script = Path(sys.executable).parent / "normbridge"
    done = subprocess.run(
        [str(script), "recalibrate", str(source), str(data), "-o", str(out), "--batch-size", "6", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["framework"] == "keras"
    new = keras.saving.load_model(out, safe_mode=True)
    assert not np.array_equal(new.get_layer("bn1").moving_mean.numpy(), model.get_layer("bn1").moving_mean.numpy())
    assert np.array_equal(new.get_layer("conv1").get_weights()[0], model.get_layer("conv1").get_weights()[0])
