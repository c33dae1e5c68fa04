"""Closing the loop: `normbridge recalibrate --register NAME@N` on recent traffic registers a 'recalibrated' child
version.

A calibrated CNN is registered, then recalibrated on shifted traffic: the child has the parent in its
lineage, its diff says the weights are identical and the running statistics changed in every
BatchNorm, and the recalibrated model no longer drifts on that traffic.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from converters.models.monitoring.drift import drift_check
from converters.models.loading import load_model
from converters.models.monitoring.recalibration import recalibrate
from registry.service import Registry
from tests.converters.models.test_drift import BATCH, RED_SHIFTED, cnn, images


class Served(torch.nn.Module):
    """The test CNN behind a forward(x) (the .pt2 reader names a program's input after the forward's argument)."""

    def __init__(self):
        super().__init__()
        self.net = cnn()

    def forward(self, x):
        return self.net(x)


@pytest.fixture()
def served(tmp_path):
    calibrated, _ = recalibrate(Served().eval(), [images(32, seed=i) for i in range(4)])
    path = tmp_path / "cnn.pt2"
    torch.export.save(
        torch.export.export(calibrated, (torch.from_numpy(images(2)),), dynamic_shapes=({0: BATCH},)), path
    )
    np.save(tmp_path / "traffic.npy", images(96, means=RED_SHIFTED, seed=11))
    db, blobs = f"sqlite:///{tmp_path / 'registry.db'}", str(tmp_path / "blobs")
    return path, tmp_path / "traffic.npy", db, blobs


def test_recalibrate_registers_a_recalibrated_child_whose_diff_names_the_moved_statistics(served, cli_app, tmp_path):
    model, traffic, db, blobs = served
    store = ["--db", db, "--blobs", blobs]
    runner = CliRunner()
    assert runner.invoke(cli_app, ["register", "cnn", str(model), *store]).exit_code == 0
    assert drift_check(load_model(model), traffic).verdict == "drift"  # the alert that starts the loop

    done = runner.invoke(
        cli_app,
        [
            "recalibrate",
            str(model),
            str(traffic),
            "-o",
            str(tmp_path / "new.pt2"),
            "--register",
            "cnn@1",
            *store,
            "--json",
        ],
    )
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["registered"] is True and report["version"] == "cnn@2" and report["parent"] == "cnn@1"
    assert report["diff"] == "weights identical, running statistics changed in 3 layers"

    registry = Registry(db=db, blobs=blobs)
    child = registry.show("cnn@2")
    assert child.parent == "cnn@1" and child.operation == "recalibrated" and "96 samples of traffic.npy" in child.note
    assert registry.lineage("cnn@2").ancestors == ["cnn@1"]
    diff = json.loads(runner.invoke(cli_app, ["diff", "cnn@1", "cnn@2", *store, "--json"]).output)
    assert (
        diff["headline"] == report["diff"]
        and diff["weights_identical"] is True
        and len(diff["statistics_changed_layers"]) == 3
    )
    assert drift_check(load_model(tmp_path / "new.pt2"), traffic).verdict == "no drift"  # the loop is closed

    table = runner.invoke(
        cli_app,
        ["recalibrate", str(model), str(traffic), "-o", str(tmp_path / "again.pt2"), "--register", "cnn@1", *store],
    )
    assert table.exit_code == 0, table.output
    assert (
        "registered cnn@2 (recalibrated from cnn@1): weights identical, running statistics changed in 3 layers"
        in " ".join(table.output.split())
    )


def test_an_unknown_parent_is_refused_before_any_work(served, cli_app, tmp_path):
    model, traffic, db, blobs = served
    done = CliRunner().invoke(
        cli_app,
        [
            "recalibrate",
            str(model),
            str(traffic),
            "-o",
            str(tmp_path / "new.pt2"),
            "--register",
            "nope@1",
            "--db",
            db,
            "--blobs",
            blobs,
        ],
    )
    assert done.exit_code == 13, done.output
    assert not (tmp_path / "new.pt2").exists()
