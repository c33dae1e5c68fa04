"""Why a layer alarms: a moved input is DRIFT, statistics that never converged are `unconverged_statistics`.

The measured cases of issue 17: a CNN trained for 10 steps on its training distribution kept about a
third of BatchNorm's initial statistics and alarmed on data from that same distribution; an untrained
MobileNetV3-like model alarmed on all its layers and printed rows that truncated to one name. The
expected numbers come from NumPy: the momentum updates simulated batch by batch, the share of the
initial values left, and the bias-corrected statistics.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from rich.console import Console
from torch import nn
from typer.testing import CliRunner

from cli.commands.monitoring import UNCONVERGED_EXIT_CODE, _drift_table
from cli.fitting import print_table
from converters.models.monitoring.drift import drift_check
from schemas.serving import DriftLayer, DriftReport
from tests.converters.models.test_drift import BATCH, RED_SHIFTED, cnn, images

MOMENTUM, STEPS = 0.1, 10


def trained_briefly(model: nn.Module, steps: int = STEPS) -> nn.Module:
    """`steps` SGD steps on images of the training distribution (what a new user's first run does)."""
    torch.manual_seed(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model.train()
    for step in range(steps):
        loss = model(torch.from_numpy(images(32, seed=100 + step))).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def numpy_running_statistics(batches: list[np.ndarray], momentum: float) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's update, in NumPy: from (0, 1), running <- (1 - m) running + m batch (unbiased variance)."""
    mean, var = np.zeros(batches[0].shape[1]), np.ones(batches[0].shape[1])
    for x in batches:
        x = x.astype(np.float64).transpose(1, 0, 2, 3).reshape(x.shape[1], -1)
        mean = (1 - momentum) * mean + momentum * x.mean(axis=1)
        var = (1 - momentum) * var + momentum * x.var(axis=1, ddof=1)
    return mean, var


def numpy_score(x: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float) -> float:
    """The worst channel's statistic over its default threshold (0.5 standard deviations, a factor of 2)."""
    x = x.astype(np.float64).transpose(1, 0, 2, 3).reshape(x.shape[1], -1)
    shift = np.abs(x.mean(axis=1) - mean) / np.sqrt(var + eps)
    ratio = np.abs(np.log((x.var(axis=1) + eps) / (var + eps)))
    return float(max(shift.max() / 0.5, ratio.max() / np.log(2)))


def test_ten_steps_of_one_batchnorm_leave_a_third_of_the_initial_values_and_that_is_not_drift():
    bn = nn.BatchNorm2d(3)
    batches = [images(32, seed=100 + step) for step in range(STEPS)]
    bn.train()
    with torch.no_grad():
        for x in batches:
            bn(torch.from_numpy(x))
    bn.eval()
    mean, var = numpy_running_statistics(batches, MOMENTUM)
    np.testing.assert_allclose(bn.running_mean.numpy(), mean, rtol=1e-5, atol=1e-6)  # the premise, checked
    np.testing.assert_allclose(bn.running_var.numpy(), var, rtol=1e-5)
    weight = (1 - MOMENTUM) ** STEPS
    fresh, moved = images(512, seed=7), images(512, means=RED_SHIFTED, seed=7)
    corrected_mean, corrected_var = mean / (1 - weight), (var - weight) / (1 - weight)
    assert numpy_score(fresh, mean, var, bn.eps) > 1 and numpy_score(fresh, corrected_mean, corrected_var, bn.eps) <= 1
    assert numpy_score(moved, corrected_mean, corrected_var, bn.eps) > 1

    calm = drift_check(nn.Sequential(bn), fresh)
    (layer,) = calm.layers
    assert layer.alarm and layer.status == "unconverged_statistics", layer
    assert layer.batches_tracked == STEPS and layer.momentum == pytest.approx(MOMENTUM)
    assert (
        layer.initial_weight == pytest.approx(weight)
        and "num_batches_tracked=10" in layer.reason
        and "35%" in layer.reason
    )
    assert calm.verdict == "unconverged statistics" and calm.alarms == [] and calm.unconverged == ["0"]
    shifted = drift_check(nn.Sequential(bn), moved)
    assert shifted.verdict == "drift" and shifted.alarms == ["0"] and shifted.layers[0].status == "drift"


@pytest.fixture(scope="module")
def briefly_trained() -> nn.Module:
    return trained_briefly(cnn())


def test_a_cnn_trained_for_ten_steps_does_not_say_drift_on_its_training_distribution(briefly_trained):
    program = torch.export.export(briefly_trained, (torch.from_numpy(images(2)),), dynamic_shapes=({0: BATCH},))
    onnx_model = torch.onnx.export(
        briefly_trained,
        (torch.from_numpy(images(2)),),
        dynamo=True,
        dynamic_shapes=({0: BATCH},),
        optimize=False,
        verbose=False,
    ).model_proto
    for model in (briefly_trained, program, onnx_model):
        calm = drift_check(model, images(256, seed=7))
        assert all(layer.alarm for layer in calm.layers)  # what the first user saw: every layer over the thresholds
        assert calm.verdict == "unconverged statistics" and calm.alarms == [], [(l.name, l.status) for l in calm.layers]
        assert [l.status for l in calm.layers] == ["unconverged_statistics"] * 3
        assert calm.layers[0].initial_weight == pytest.approx(
            (1 - MOMENTUM) ** STEPS, abs=0.01
        )  # fitted for ONNX, counted for torch
        moved = drift_check(model, images(256, means=RED_SHIFTED, seed=7))
        assert moved.verdict == "drift" and moved.alarms[0] == "1"


def mobilenet_like() -> nn.Module:
    """Untrained, 34 BatchNorms named as torchvision's MobileNetV3 names them (features.N.block.M.1),
    many differing only at the end."""
    torch.manual_seed(0)
    layers, channels = [nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Hardswish())], 8
    for _ in range(11):
        block = nn.Sequential(
            *[
                nn.Sequential(nn.Conv2d(channels, channels, 1), nn.BatchNorm2d(channels), nn.Hardswish())
                for _ in range(3)
            ]
        )
        layers.append(nn.ModuleDict({"block": block}))
    model = _Features(nn.ModuleList(layers))
    return model.eval()


class _Features(nn.Module):
    def __init__(self, features: nn.ModuleList):
        super().__init__()
        self.features = features

    def forward(self, x):
        for layer in self.features:
            x = layer["block"](x) if isinstance(layer, nn.ModuleDict) else layer(x)
        return x


def test_an_untrained_model_reports_unconverged_statistics_on_every_layer_not_drift(cli_app, tmp_path):
    model = mobilenet_like()
    report = drift_check(model, images(64, seed=3))
    assert len(report.layers) == 34 and report.alarms == [] and report.verdict == "unconverged statistics"
    assert all(
        l.status == "unconverged_statistics" and l.initial_weight == 1.0 and "exactly their initial values" in l.reason
        for l in report.layers
    )
    program = torch.export.export(model, (torch.from_numpy(images(2)),))
    torch.export.save(program, tmp_path / "mobilenet_like.pt2")
    np.save(tmp_path / "traffic.npy", images(16, seed=4))
    done = CliRunner().invoke(
        cli_app, ["drift", str(tmp_path / "mobilenet_like.pt2"), str(tmp_path / "traffic.npy"), "--json"]
    )
    assert done.exit_code == UNCONVERGED_EXIT_CODE, done.output
    assert json.loads(done.output)["unconverged"] == [layer.name for layer in report.layers]


def test_layer_rows_keep_distinct_names_distinct_at_80_columns():
    names = [f"features.{i}.block.{j}.squeeze_excitation.fc{k}.bn" for i in range(4) for j in range(3) for k in (1, 2)]
    names.append(
        "backbone." + "very_long_stage_name_" * 4 + "bn_last"
    )  # wider than any column could be: folded, never cut
    layer = dict(
        channels=16,
        max_shift=3.0,
        mean_shift=1.0,
        worst_shift_channel=2,
        max_abs_log_ratio=1.0,
        mean_abs_log_ratio=0.5,
        worst_ratio_channel=3,
        alarm=True,
        status="drift",
    )
    report = DriftReport(
        model="m",
        framework="torch",
        samples=8,
        thresholds={},
        layers=[DriftLayer(name=n, **layer) for n in names],
        alarms=names,
        verdict="drift",
    )
    console = Console(width=80, record=True, color_system=None, force_terminal=False)
    print_table(_drift_table(report), console=console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    flat = re.sub(r"\s+", "", text)
    for name in names[:-1]:
        assert re.search(rf"(^|[\s│┃]){re.escape(name)}($|[\s│┃])", text, re.M), (
            f"{name} is not whole on one line:\n{text}"
        )
    assert names[-1] in flat and "…" not in text  # the too-wide name folds across lines: every character kept
