"""`unconverged_statistics`: a BatchNorm trained for a few steps still carries a share of its initial mean 0 / var 1.

The oracle is NumPy, independent of the rule under test: the torch layer is trained N steps on known data, NumPy
replays its running-average update from the batches, and the share of the initial variance left is measured by
linear superposition (the same replay started from variance 1 and from variance 0 differ by exactly that share),
never from the (1 - momentum) ** N formula the hazard uses. Converged layers, cumulative averages and statistics no
running average can give are not flagged; formats without a batch counter say the question was not judged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from converters.models.inspection import inspect_model
from converters.models.serving.source_hazards import serving_hazards

MOMENTUM = 0.1
FLOOR = 0.05  # the share below which statistics count as converged (documented in docs/whole-models.md)


def batches(steps: int, seed: int = 0) -> list[np.ndarray]:
    """Known data: 16 samples of 4 channels per batch, channel c with mean 2c - 3 and standard deviation c + 0.5."""
    rng = np.random.default_rng(seed)
    means, stds = np.arange(4) * 2.0 - 3.0, np.arange(4) + 0.5
    return [(rng.standard_normal((16, 4)) * stds + means).astype(np.float32) for _ in range(steps)]


def trained_bn(data: list[np.ndarray], momentum: float | None = MOMENTUM) -> nn.Module:
    model = nn.Sequential(nn.BatchNorm1d(4, momentum=momentum))
    model.train()
    with torch.no_grad():
        for x in data:
            model(torch.from_numpy(x))
    return model.eval()


def replay(
    data: list[np.ndarray], momentum: float, start_mean: float, start_var: float
) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's running-average update, by hand in float64: mean and unbiased variance of each batch."""
    mean, var = np.full(4, start_mean), np.full(4, start_var)
    for x in data:
        x = x.astype(np.float64)
        mean = (1 - momentum) * mean + momentum * x.mean(axis=0)
        var = (1 - momentum) * var + momentum * x.var(axis=0, ddof=1)
    return mean, var


def unconverged(model) -> list:
    return [(where, h) for where, h in inspect_model(model).all_hazards() if h.code == "unconverged_statistics"]


@pytest.mark.parametrize("steps", [3, 10, 20])
def test_a_few_steps_leave_the_share_numpy_measures_and_the_hazard_names_it(steps):
    data = batches(steps)
    model = trained_bn(data)
    bn = model[0]
    mean, var = replay(data, MOMENTUM, 0.0, 1.0)
    assert np.allclose(bn.running_var.numpy(), var, rtol=1e-5) and np.allclose(bn.running_mean.numpy(), mean, atol=1e-5)
    share = float(
        np.mean(replay(data, MOMENTUM, 0.0, 1.0)[1] - replay(data, MOMENTUM, 0.0, 0.0)[1])
    )  # the initial variance's share
    assert share >= FLOOR
    needed = next(
        t for t in range(1, 1000) if np.prod(np.full(t, 1 - MOMENTUM)) < FLOOR
    )  # batches until the share is below the floor
    ((where, hazard),) = unconverged(model)
    assert where == "0" and hazard.severity == "warning"
    assert f"num_batches_tracked={steps} at momentum 0.1" in hazard.message
    assert f"{share:.0%} of them is still the initial values" in hazard.message
    assert f"reaches {needed} " in hazard.message and "normbridge drift" in hazard.message
    program = torch.export.export(
        model, (torch.from_numpy(data[0]),)
    )  # the same from an exported program's op and buffers
    assert [h.message for _, h in unconverged(program)] == [hazard.message]
    assert [(h.layer, h.code) for h in serving_hazards(model) if h.code == "unconverged_statistics"] == [
        ("0", "unconverged_statistics")
    ]


def test_converged_statistics_are_not_flagged():
    data = batches(60)
    share = float(np.mean(replay(data, MOMENTUM, 0.0, 1.0)[1] - replay(data, MOMENTUM, 0.0, 0.0)[1]))
    assert share < FLOOR  # 60 steps at 0.1 leave 0.18%
    assert unconverged(trained_bn(data)) == []
    assert (
        unconverged(trained_bn(batches(10), momentum=0.5)) == []
    )  # a faster running average forgets sooner: 0.1% left
    assert (
        unconverged(trained_bn(batches(3), momentum=None)) == []
    )  # a cumulative average keeps none of the initial values


def test_statistics_no_running_average_can_give_are_not_called_unconverged():
    model = trained_bn(batches(10))
    share = float(np.mean(replay(batches(10), MOMENTUM, 0.0, 1.0)[1] - replay(batches(10), MOMENTUM, 0.0, 0.0)[1]))
    with torch.no_grad():  # a variance below the initial share: w + (1 - w) * sigma^2 cannot be that small
        model[0].running_var[0] = share / 2
    assert unconverged(model) == []


def test_formats_without_a_batch_counter_say_it_was_not_judged(tmp_path):
    model = trained_bn(batches(10))
    path = tmp_path / "bn.onnx"
    torch.onnx.export(
        model,
        (torch.from_numpy(batches(1)[0]),),
        str(path),
        dynamo=False,
        training=torch.onnx.TrainingMode.EVAL,
        do_constant_folding=False,
    )
    inspection = inspect_model(path)
    assert unconverged(path) == []
    (note,) = [h for h in inspection.hazards if h.code == "convergence_unjudged"]
    assert note.severity == "info" and "keep no batch counter" in note.message and "normbridge drift" in note.message
    assert not [
        h for h in inspect_model(model).hazards if h.code == "convergence_unjudged"
    ]  # torch keeps the counter: judged
