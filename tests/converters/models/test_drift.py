"""Drift monitor on a small CNN whose BatchNorm statistics were estimated on a known image distribution.

Training data: per-channel colour means (0.5, 0.4, 0.3), std 0.2. Fresh data from it must not
alarm; the same images with the red channel shifted by +0.4 (two standard deviations) must, and
the first BatchNorm (which sees the input colours through one convolution) must be among the
alarmed layers. The same numbers must come out of torch forward hooks, the ExportedProgram
interpreter and onnxruntime extra outputs, and match statistics recomputed with NumPy.
"""

from __future__ import annotations

import json
import logging
import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from converters.models.monitoring.drift import drift_check
from converters.models.monitoring.recalibration import recalibrate
from schemas import UnsupportedObjectError
from schemas.serving import DriftThresholds

warnings.filterwarnings("ignore", message=".*LeafSpec.*")
logging.getLogger("torch.onnx").setLevel(logging.ERROR)

TRAINING_MEANS = (0.5, 0.4, 0.3)
RED_SHIFTED = (0.9, 0.4, 0.3)
BATCH = torch.export.Dim("batch", min=1, max=1024)


def images(n: int, means=TRAINING_MEANS, std: float = 0.2, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 3, 16, 16)) * std + np.asarray(means)[None, :, None, None]).astype(np.float32)


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 4),
    ).eval()


@pytest.fixture(scope="module")
def calibrated() -> nn.Module:
    model, _ = recalibrate(cnn(), [images(32, seed=i) for i in range(4)])
    return model


@pytest.fixture(scope="module")
def exported(calibrated):
    # optimize=False: torch.onnx's optimizer folds BatchNorm into the Conv, leaving nothing to monitor.
    return torch.onnx.export(
        calibrated,
        (torch.from_numpy(images(2)),),
        dynamo=True,
        dynamic_shapes=({0: BATCH},),
        optimize=False,
        verbose=False,
    ).model_proto


def test_fresh_data_from_the_training_distribution_does_not_alarm(calibrated):
    report = drift_check(calibrated, images(64, seed=100))
    assert report.verdict == "no drift" and report.alarms == []
    assert [layer.name for layer in report.layers] == ["1", "4", "7"]
    assert max(layer.max_shift for layer in report.layers) < 0.25
    assert max(layer.max_abs_log_ratio for layer in report.layers) < 0.35
    assert report.thresholds == DriftThresholds(shift=0.5, log_ratio=math.log(2)) and report.samples == 64


def test_red_shift_alarms_starting_at_the_first_layer_with_numpy_numbers(calibrated):
    data = images(64, means=RED_SHIFTED, seed=101)
    report = drift_check(calibrated, data, batch_size=24)
    assert report.verdict == "drift" and report.alarms[0] == "1"
    first = report.layers[0]
    assert first.alarm and first.max_shift > 1.0
    # NumPy cross-check of the first layer: its input is conv0(x), pooled over batch and positions.
    conv, bn = calibrated[0], calibrated[1]
    with torch.no_grad():
        z = conv(torch.from_numpy(data)).double().numpy()
    mean, var = z.mean(axis=(0, 2, 3)), z.var(axis=(0, 2, 3))
    rm, rv = bn.running_mean.double().numpy(), bn.running_var.double().numpy()
    shift = np.abs(mean - rm) / np.sqrt(rv + bn.eps)
    ratio = np.abs(np.log((var + bn.eps) / (rv + bn.eps)))
    assert first.max_shift == pytest.approx(shift.max(), rel=1e-9)
    assert first.mean_shift == pytest.approx(shift.mean(), rel=1e-9)
    assert first.max_abs_log_ratio == pytest.approx(ratio.max(), rel=1e-9)
    assert first.worst_shift_channel == int(shift.argmax())
    # The channels that moved most are the ones the red input feeds most strongly.
    red_gain = np.abs(conv.weight.detach().double().numpy()[:, 0].sum(axis=(1, 2))) / np.sqrt(rv + bn.eps)
    assert int(np.argmax(red_gain)) == first.worst_shift_channel


def test_onnx_extra_outputs_and_exported_program_match_torch_hooks(calibrated, exported):
    data = images(48, means=RED_SHIFTED, seed=102)
    by_torch = drift_check(calibrated, data)
    by_onnx = drift_check(exported, data)
    program = torch.export.export(calibrated, (torch.from_numpy(images(2)),), dynamic_shapes=({0: BATCH},))
    by_program = drift_check(program, data)
    for other in (by_onnx, by_program):
        assert [layer.name for layer in other.layers] == [layer.name for layer in by_torch.layers]
        assert other.alarms == by_torch.alarms
        for a, b in zip(by_torch.layers, other.layers):
            assert b.max_shift == pytest.approx(a.max_shift, rel=1e-4)
            assert b.mean_shift == pytest.approx(a.mean_shift, rel=1e-4)
            assert b.max_abs_log_ratio == pytest.approx(a.max_abs_log_ratio, rel=1e-4, abs=1e-6)


def test_folded_batchnorm_has_nothing_to_monitor(calibrated):
    folded = torch.onnx.export(
        calibrated, (torch.from_numpy(images(2)),), dynamo=True, dynamic_shapes=({0: BATCH},), verbose=False
    ).model_proto
    assert not any(n.op_type == "BatchNormalization" for n in folded.graph.node)  # torch.onnx's optimizer folded them
    with pytest.raises(UnsupportedObjectError, match="folded"):
        drift_check(folded, images(8))


def test_thresholds_decide_the_alarm(calibrated):
    data = images(32, means=RED_SHIFTED, seed=103)
    worst = drift_check(calibrated, data)
    loose = drift_check(calibrated, data, {"shift": max(l.max_shift for l in worst.layers) + 0.01, "log_ratio": 10.0})
    assert worst.verdict == "drift" and loose.verdict == "no drift"
    assert [l.max_shift for l in loose.layers] == [l.max_shift for l in worst.layers]


def test_keras_functional_model_reads_batchnorm_inputs():
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    conv = keras.layers.Conv2D(4, 3, padding="same")
    bn = keras.layers.BatchNormalization(epsilon=1e-3)
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(bn(conv(inputs))))
    train = np.transpose(images(64, seed=1), (0, 2, 3, 1))[:, :8, :8]
    z = keras.ops.convert_to_numpy(conv(train)).astype(np.float64)
    bn.moving_mean.assign(z.mean(axis=(0, 1, 2)).astype(np.float32))
    bn.moving_variance.assign(z.var(axis=(0, 1, 2)).astype(np.float32))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        same = drift_check(model, np.transpose(images(64, seed=2), (0, 2, 3, 1))[:, :8, :8])
        shifted = drift_check(model, np.transpose(images(64, means=RED_SHIFTED, seed=3), (0, 2, 3, 1))[:, :8, :8])
    assert same.verdict == "no drift" and shifted.verdict == "drift" and shifted.framework == "keras"
    # the layer inputs are read as the model takes them: Keras has nothing to warn about (it printed on drift's stderr)
    assert not [w for w in seen if issubclass(w.category, UserWarning)], [str(w.message) for w in seen]


def test_cli_drift_exit_codes_and_json(exported, tmp_path, cli_app):
    import onnx

    onnx.save(exported, tmp_path / "cnn.onnx")
    np.save(tmp_path / "same.npy", images(40, seed=104))
    np.savez(tmp_path / "shifted.npz", x=images(40, means=RED_SHIFTED, seed=105))
    runner = CliRunner()
    quiet = runner.invoke(cli_app, ["drift", str(tmp_path / "cnn.onnx"), str(tmp_path / "same.npy")])
    assert quiet.exit_code == 0, quiet.output
    assert "no drift" in quiet.output
    loud = runner.invoke(cli_app, ["drift", str(tmp_path / "cnn.onnx"), str(tmp_path / "shifted.npz"), "--json"])
    assert loud.exit_code == 11, loud.output
    report = json.loads(loud.output)
    assert report["verdict"] == "drift" and report["alarms"][0] == "1" and report["samples"] == 40
    table = runner.invoke(
        cli_app,
        [
            "drift",
            str(tmp_path / "cnn.onnx"),
            str(tmp_path / "shifted.npz"),
            "--shift-threshold",
            "100",
            "--ratio-threshold",
            "1000",
        ],
    )
    assert table.exit_code == 0 and "DRIFT" not in table.output
    bad = runner.invoke(
        cli_app, ["drift", str(tmp_path / "cnn.onnx"), str(tmp_path / "same.npy"), "--ratio-threshold", "0.5"]
    )
    assert bad.exit_code == 6 and "ratio-threshold" in bad.output


def test_data_with_a_nan_or_no_samples_is_refused_not_read_as_no_drift(calibrated, exported, tmp_path, cli_app):
    """One NaN pixel made every statistic NaN, every comparison false: 'no drift', exit 0, and a recorded 'ok'."""
    import onnx

    from schemas import InputFileError

    poisoned = images(16, seed=106)
    poisoned[3, 1, 2, 2] = np.nan
    with pytest.raises(InputFileError, match=r"1 NaN or infinite values \(the first in sample 3\)"):
        drift_check(calibrated, poisoned)
    infinite = images(16, seed=107)
    infinite[0, 0, 0, 0] = np.inf
    with pytest.raises(InputFileError, match="NaN or infinite"):
        recalibrate(cnn(), [infinite])
    with pytest.raises(InputFileError, match="no samples"):
        drift_check(calibrated, images(0))
    onnx.save(exported, tmp_path / "cnn.onnx")
    np.save(tmp_path / "nan.npy", poisoned)
    done = CliRunner().invoke(cli_app, ["drift", str(tmp_path / "cnn.onnx"), str(tmp_path / "nan.npy"), "--json"])
    assert done.exit_code == 6 and "nan.npy" in done.output and "no drift" not in done.output, done.output
