"""Drift checks recorded against registered versions: the library (SQLite and PostgreSQL) and `normbridge drift
--record`.

A real drift check of the registered CNN on inputs shifted away from what its BatchNorms saw is
stored, read back newest first with every number intact, and audited in the same hash chain as
the registrations; a reference to a version that does not exist stores nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from converters.models.monitoring.drift import drift_check
from registry.drift_records import DriftRecord, drift_reports, record_drift
from schemas.errors import NotFoundError, RegistryError
from schemas.serving import DriftThresholds
from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli
from tests.pg import registry_on
from tests.registry.test_registry_service import finetune_statistics, save_pt2, trained_cnn

ROOT = Path(__file__).resolve().parents[2]


def shifted_inputs(n: int = 32, shift: float = 1.5, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, 3, 8, 8)) * 2.0 + shift).astype(np.float32)


@pytest.fixture(params=["sqlite", "postgresql"])
def registry(request, tmp_path):
    with registry_on(request.param, tmp_path, "monitor") as reg:
        yield reg


def test_recorded_reports_come_back_newest_first_with_their_numbers_and_are_audited(registry):
    model = trained_cnn()
    registry.register("cnn", model)
    assert drift_reports(registry, "cnn@1") == []

    calm = drift_check(model, shifted_inputs(shift=0.0, seed=1), DriftThresholds(shift=5.0, log_ratio=3.0))
    alarming = drift_check(model, shifted_inputs(shift=1.5), DriftThresholds(shift=0.2))
    assert calm.verdict == "no drift" and alarming.verdict == "drift"  # the two records differ in what matters

    first = record_drift(registry, "cnn@1", calm)
    second = record_drift(
        registry.as_user("oncall"), "cnn", alarming.model_dump(mode="json")
    )  # 'cnn' = latest; a JSON dict is accepted
    assert isinstance(second, DriftRecord) and second.id != first.id
    assert (second.model, second.number, second.user) == ("cnn", 1, "oncall")

    stored = drift_reports(registry, "cnn@1")
    assert [r.id for r in stored] == [second.id, first.id]
    assert stored[0].report == alarming and stored[1].report == calm  # thresholds and every per-layer float intact
    assert stored[0].report.thresholds.shift == 0.2
    assert stored[0].created_at.tzinfo is not None and stored[0].created_at >= stored[1].created_at

    entries = [e for e in registry.audit(model="cnn") if e.action == "drift_recorded"]
    assert [(e.user, e.number, e.detail["drift_report"], e.detail["verdict"]) for e in entries] == [
        ("monitor", 1, first.id, "no drift"),
        ("oncall", 1, second.id, "drift"),
    ]
    assert entries[1].detail["alarms"] == alarming.alarms
    assert registry.verify_audit() == []


def test_a_missing_version_or_a_wrong_report_type_stores_nothing(registry):
    model = trained_cnn()
    registry.register("cnn", model)
    report = drift_check(model, shifted_inputs())
    audit_before = len(registry.audit())
    with pytest.raises(NotFoundError, match="cnn@7"):
        record_drift(registry, "cnn@7", report)
    with pytest.raises(NotFoundError):
        record_drift(registry, "ghost@1", report)
    with pytest.raises(RegistryError, match="DriftReport"):
        record_drift(registry, "cnn@1", "not a report")
    assert drift_reports(registry, "cnn@1") == [] and len(registry.audit()) == audit_before


@pytest.mark.slow
def test_drift_record_option_stores_the_report_the_command_printed(tmp_path):
    from registry.service import Registry

    db, blobs = f"sqlite:///{tmp_path / 'registry.db'}", str(tmp_path / "blobs")
    model = trained_cnn()
    Registry(db=db, blobs=blobs, user="ci").register("cnn", model)
    model_file = save_pt2(model, tmp_path / "cnn.pt2")
    data_file = tmp_path / "inputs.npy"
    np.save(data_file, shifted_inputs())
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "NORMBRIDGE_USER": "nightly"}

    def drift(*extra: str, process: bool = False) -> subprocess.CompletedProcess:
        args = ["drift", str(model_file), str(data_file), "--json", "--db", db, "--blobs", blobs, *extra]
        if not process:  # the console script's app in this process
            return invoke_cli(*args, cwd=ROOT, env={"NORMBRIDGE_USER": "nightly"})
        return subprocess.run(
            [*normbridge_command(), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
        )

    missing = drift("--record", "cnn@9")
    assert missing.returncode == 13, missing.stderr[-2000:]  # NotFoundError, before any forward pass
    assert (
        json.loads(missing.stdout)["error"]["code"] == "not_found" and "cnn@9" in missing.stdout
    )  # --json: the error is JSON too

    done = drift("--record", "cnn@1", "--shift-threshold", "0.2", process=True)
    assert done.returncode == 11, done.stderr[-2000:]  # the alarm still decides the exit code
    printed = json.loads(done.stdout)
    assert "recorded drift report" in done.stderr and "cnn@1" in done.stderr

    [stored] = drift_reports(Registry(db=db, blobs=blobs), "cnn@1")
    assert stored.report.model_dump(mode="json") == printed
    assert stored.user == "nightly" and stored.report.verdict == "drift"


def test_a_report_computed_on_other_statistics_is_refused(registry):
    """Issue 14 item 6: a report belongs to the version whose running statistics it was computed against."""
    model = trained_cnn()
    registry.register("cnn", model)
    other = finetune_statistics(trained_cnn())  # same weights, other running statistics
    registry.register("cnn", other)
    audit_before = len(registry.audit())
    report = drift_check(other, shifted_inputs())
    with pytest.raises(RegistryError, match="not those of cnn@1"):
        record_drift(registry, "cnn@1", report)
    with pytest.raises(RegistryError, match="no statistics_digest"):
        record_drift(
            registry,
            "cnn@1",
            {**drift_check(model, shifted_inputs()).model_dump(mode="json"), "statistics_digest": None},
        )
    assert drift_reports(registry, "cnn@1") == [] and len(registry.audit()) == audit_before
    assert record_drift(registry, "cnn@2", report).number == 2  # the version it was computed on takes it


@pytest.mark.slow
def test_drift_record_with_server_records_there_and_never_opens_a_local_registry(tmp_path):
    from registry.service import Registry
    from tests.http_server import create_token, running_server

    db, blobs = f"sqlite:///{tmp_path / 'registry.db'}", str(tmp_path / "blobs")
    model = trained_cnn()
    Registry(db=db, blobs=blobs, user="ci").register("cnn", model)
    Registry(db=db, blobs=blobs, user="ci").register("cnn", finetune_statistics(trained_cnn()))
    model_file = save_pt2(model, tmp_path / "cnn.pt2")
    data_file = tmp_path / "inputs.npy"
    np.save(data_file, shifted_inputs())
    home = tmp_path / "home"  # where a local registry would be created
    token = create_token(db, "nightly", "write", ["cnn"])
    with running_server(db=db, blobs=blobs, log=tmp_path / "serve.log") as server:
        env = {
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "NORMBRIDGE_HOME": str(home),
            "NORMBRIDGE_SERVER": server.url,
            "NORMBRIDGE_TOKEN": token,
        }
        env.pop("NORMBRIDGE_DB", None), env.pop("NORMBRIDGE_BLOBS", None)

        def drift(ref: str, process: bool = False) -> subprocess.CompletedProcess:
            args = ["drift", str(model_file), str(data_file), "--json", "--record", ref]
            if not process:  # the console script's app in this process, in the same environment
                return invoke_cli(
                    *args,
                    cwd=ROOT,
                    env={
                        "NORMBRIDGE_HOME": str(home),
                        "NORMBRIDGE_SERVER": server.url,
                        "NORMBRIDGE_TOKEN": token,
                        "NORMBRIDGE_DB": None,
                        "NORMBRIDGE_BLOBS": None,
                    },
                )
            return subprocess.run(
                [*normbridge_command(), *args],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
                check=False,
            )

        missing = drift("cnn@9")
        assert missing.returncode == 13 and json.loads(missing.stdout)["error"]["code"] == "not_found", missing.stderr[
            -2000:
        ]
        wrong = drift("cnn@2")  # the file holds cnn@1's statistics
        assert wrong.returncode == 14, wrong.stderr[-2000:]
        assert "not those of cnn@2" in json.loads(wrong.stdout)["error"]["message"]
        done = drift("cnn@1", process=True)
        assert done.returncode in (0, 11), done.stderr[-2000:]
        assert "recorded drift report" in done.stderr
    assert not home.exists()  # no local registry was created on the way
    [stored] = drift_reports(Registry(db=db, blobs=blobs), "cnn@1")
    assert stored.user == "nightly" and stored.report.model_dump(mode="json") == json.loads(done.stdout)
    assert drift_reports(Registry(db=db, blobs=blobs), "cnn@2") == []
