"""The `Gate` a Registry is given (converters/gate/gates.py): chosen by whoever builds the registry, asked only once the
model is read, and the CLI's built in one place from its settings (registry/worker_jobs.py `cli_gate`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from converters.gate import ChildWorkerGate, InProcessGate, SharedWorkerGate
from registry.service import Registry
from registry.settings import DEFAULT_WORKER_IDLE
from registry.worker_jobs import cli_gate, worker_jobs
from schemas.errors import RegistryError
from tests.registry.test_registry_service import trained_cnn


class RecordingGate(InProcessGate):
    """Every check in this process, recording what the registry asked of it and what it was handed."""

    def __init__(self):
        super().__init__()
        self.asked: list[tuple[str, object]] = []

    def expect(self, model):
        self.asked.append(("expect", model))

    def check_all(self, specs, progress=None):
        self.asked.append(("check_all", [spec.name for spec in specs]))
        return super().check_all(specs, progress)


def test_a_registry_checks_through_the_gate_it_was_given_once_the_model_is_read(tmp_path):
    """The gate is asked once, with every normalizer's spec (so the model was read before it), and never to prepare for
    a model before its reading: the registration's walk reads the model first."""
    gate = RecordingGate()
    registry = Registry(
        db=f"sqlite:///{tmp_path / 'registry.db'}", blobs=str(tmp_path / "blobs"), user="tester", gate=gate
    )
    done = registry.register("cnn", trained_cnn())
    assert [asked for asked, _ in gate.asked] == ["check_all"]
    assert gate.asked[0][1] == [check.layer for check in done.checks] and len(done.checks) >= 2
    assert all(check.passed for check in done.checks)
    assert registry.as_user("other").gate is gate  # a per-request clone (the HTTP API's) keeps it


def test_a_registry_given_no_gate_checks_the_frameworks_it_has_not_imported_in_a_child(tmp_path):
    registry = Registry(db=f"sqlite:///{tmp_path / 'registry.db'}", blobs=str(tmp_path / "blobs"))
    assert type(registry.gate) is ChildWorkerGate and registry.gate.spread == ()


def test_the_cli_gate_is_the_shared_workers_with_the_registrys_jobs_unless_set_private(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMBRIDGE_HOME", str(tmp_path))
    monkeypatch.delenv("NORMBRIDGE_WORKER_DIR", raising=False)
    monkeypatch.delenv("NORMBRIDGE_WORKER_IDLE", raising=False)
    monkeypatch.setenv("NORMBRIDGE_GATE_WORKER", "shared")
    gate = cli_gate()
    assert isinstance(gate, SharedWorkerGate)
    assert (gate.worker.folder, gate.worker.idle, gate.worker.jobs) == (
        tmp_path / "workers",
        DEFAULT_WORKER_IDLE,
        worker_jobs,
    )
    monkeypatch.setenv("NORMBRIDGE_WORKER_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("NORMBRIDGE_WORKER_IDLE", "30")
    assert (cli_gate().worker.folder, cli_gate().worker.idle) == (Path(tmp_path / "elsewhere"), 30.0)
    monkeypatch.setenv("NORMBRIDGE_GATE_WORKER", "private")
    assert type(cli_gate()) is ChildWorkerGate
    monkeypatch.setenv("NORMBRIDGE_GATE_WORKER", "nearby")
    with pytest.raises(RegistryError, match="NORMBRIDGE_GATE_WORKER is 'nearby'"):
        cli_gate()


def test_the_registrys_jobs_are_registered_as_a_function_the_worker_can_import():
    """The shared worker is told the function, never a module name written in converters (tests/test_layering.py)."""
    from converters.gate.shared_worker import jobs_reference

    assert jobs_reference(worker_jobs) == "registry.worker_jobs:worker_jobs"
    assert set(worker_jobs().jobs) == {"register"} and worker_jobs().prepare is not None
    with pytest.raises(ValueError, match="module-level function"):
        jobs_reference(lambda: None)
