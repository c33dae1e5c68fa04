"""Crash safety: kill a registering process at every fault point; nothing half-written is visible,
nothing committed is lost.

The registering process is real (a subprocess) and dies by os._exit(137) at the named step
(registry.faults), skipping every cleanup as a SIGKILL or power cut would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry.faults import FAULT_EXIT, FAULT_POINTS
from tests.pg import fresh_database
from tests.registry.test_registry_service import expire_leases, finetune_statistics, snapshot, trained_cnn

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from registry.service import Registry
from tests.registry.test_registry_service import finetune_statistics, trained_cnn
db, blobs, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
Registry(db=db, blobs=blobs, user="crasher").register("cnn", finetune_statistics(trained_cnn(), seed=seed))
print("survived")
"""


def register_in_subprocess(db: str, blobs: str, seed: int, fault: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    env.pop("NORMBRIDGE_FAULT", None)
    if fault:
        env["NORMBRIDGE_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, db, blobs, str(seed)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


#: each backend with the fault points it is killed at (PostgreSQL: the crash that leaves orphans, to save time)
BACKENDS = {"sqlite": FAULT_POINTS, "postgresql": ("after_blobs",)}


@pytest.fixture(params=list(BACKENDS))
def store(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry.db'}", str(tmp_path / "blobs"), BACKENDS["sqlite"]
    else:
        with fresh_database() as url:
            yield url, str(tmp_path / "blobs"), BACKENDS["postgresql"]


def test_a_crash_at_any_fault_point_leaves_a_whole_version_or_none(store):
    from registry.service import Registry

    db, blobs, points = store
    registry = Registry(db=db, blobs=blobs, user="tester")
    model = trained_cnn()
    committed = registry.register("cnn", model).version
    committed_tensors = registry.tensors("cnn@1")

    for seed, point in enumerate(points, start=1):
        before = snapshot(registry)
        run = register_in_subprocess(db, blobs, seed, point)
        assert run.returncode == FAULT_EXIT, (point, run.stdout, run.stderr[-2000:])
        assert "survived" not in run.stdout
        after = snapshot(registry)
        new_blobs = set(after["blobs"]) - set(before["blobs"])
        if point == "after_commit":
            # the transaction committed before the process died: a whole version, every blob present
            assert len(after["versions"]) == len(before["versions"]) + 1
            record = registry.show("cnn")
            assert record.user == "crasher" and record.parent == "cnn@1"
            assert {t["digest"] for t in record.manifest["tensors"].values()} <= set(after["blobs"])
            assert after["audit"][-1][1] == "register"
        else:
            # nothing half-written is visible: no version, no audit entry
            assert after["versions"] == before["versions"] and after["audit"] == before["audit"], point
            # the dead registration's blob lease keeps what it wrote until the lease expires; gc sweeps it then
            staged = list(registry.store.root.rglob(".*.tmp"))
            leased = registry.gc(grace_seconds=0)
            assert (
                leased.deleted == []
                and leased.staging_removed == 0
                and list(registry.store.root.rglob(".*.tmp")) == staged
            )
            assert set(leased.kept_in_flight) == new_blobs
            assert expire_leases(registry) > 0
            if point == "after_check":
                # blobs were staged as hidden synced files while the gate ran: none is a blob, gc sweeps them
                assert not new_blobs and staged
                swept = registry.gc(grace_seconds=0)
                assert swept.deleted == [] and swept.staging_removed > 0
                assert not list(registry.store.root.rglob(".*.tmp"))
            else:
                assert new_blobs, "the crash after_blobs should leave orphaned blobs for gc"
                young = registry.gc(grace_seconds=3600)
                assert young.deleted == [] and set(young.kept_young) == new_blobs
                swept = registry.gc(grace_seconds=0)
                assert set(swept.deleted) == new_blobs and swept.kept_in_flight == []
                assert sorted(registry.store.digests()) == before["blobs"]
        # what was committed before is intact
        assert registry.show("cnn@1") == committed
        for name, array in registry.tensors("cnn@1").items():
            assert array.tobytes() == committed_tensors[name].tobytes(), name
        assert registry.verify(rerun_checks=False).passed

    result = registry.verify()
    assert result.passed, result.render_text()
    assert [r.number for r in registry.versions("cnn")] == ([1, 2] if "after_commit" in points else [1])
    # a registration without a fault afterwards gets the next number: no gap, no duplicate
    finetune_statistics(model, seed=7)
    assert (
        registry.register("cnn", model).version.number
        == len(registry.versions("cnn"))
        == (3 if "after_commit" in points else 2)
    )
