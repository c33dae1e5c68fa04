"""gc never deletes a blob that a registration relies on (issue 11, item 4): across processes, databases and stores.

The attack: a version is deleted, so its blobs stay in the store referenced by nothing, and grow old. A new
registration of the same content finds them stored and relies on them without writing them again, while gc, which
deletes unreferenced blobs older than its grace period, runs beside it in another process (`normbridge gc` next to
`normbridge serve`). Before blob leases (registry/blob_leases.py) the version committed with its blobs gone and
`verify` reported them missing. Runs on SQLite and PostgreSQL, on a local folder and on S3 (a moto server).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from registry.artifact import extract_artifact
from registry.manifest_io import save_artifact_folder
from registry.client_transfer import folder_tar_chunks
from registry.service import Registry
from tests import moto_server
from tests.cli_process import normbridge_command
from tests.pg import fresh_database

moto_s3 = moto_server.moto_s3
s3_env = moto_server.s3_env

ROOT = Path(__file__).resolve().parents[2]
HOUR = 3600.0
LOOP_REGISTRATIONS = 30


def small_model(seed: int) -> torch.nn.Module:
    """A linear layer and a BatchNorm whose statistics moved (real training-mode forwards): 7 tensors, fast to gate."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(16, 3) * 2 + seed)
    return model.eval()


@pytest.fixture(
    params=[("sqlite", "local"), ("postgresql", "local"), ("postgresql", "s3")],
    ids=["sqlite-local", "pg-local", "pg-s3"],
)
def where(request, tmp_path):
    """(database URL, blob store URI, whether blob ages can be set): fresh for each test."""
    database, store = request.param
    blobs = str(tmp_path / "blobs") if store == "local" else f"s3://{request.getfixturevalue('s3_env')[1]}/blobs"
    if database == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry.db'}", blobs, store == "local"
        return
    with fresh_database() as url:
        yield url, blobs, store == "local"


def digests_of(record) -> set[str]:
    return {t["digest"] for t in record.manifest["tensors"].values()}


def orphan(registry: Registry, name: str, model, age: float) -> set[str]:
    """Register `model` as `name` and delete that version: its blobs stay, referenced by nothing;
    `age` seconds old (local)."""
    record = registry.register(name, model).version
    registry.delete_version(record.ref)
    digests = digests_of(record)
    if age and hasattr(registry.store, "path_of"):
        past = time.time() - age
        for digest in digests:
            os.utime(registry.store.path_of(digest), (past, past))
    return digests


def gc_process(db: str, blobs: str, grace: str) -> dict:
    """`normbridge gc` as a separate process (its own interpreter and database connection)."""
    run = subprocess.run(
        normbridge_command() + ["gc", "--grace", grace, "--json", "--db", db, "--blobs", blobs],
        cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def bundle_of(model, folder: Path) -> bytes:
    """The bundle `normbridge --server URL register FOLDER` sends for `model`."""
    artifact = save_artifact_folder(extract_artifact(model), folder)
    return b"".join(folder_tar_chunks(artifact, lambda done: None))


@pytest.mark.slow
@pytest.mark.parametrize("upload", ["model", "bundle"])
def test_gc_in_another_process_during_a_registration_keeps_the_blobs_it_relies_on(where, upload, monkeypatch, tmp_path):
    db, blobs, local = where
    registry = Registry(db=db, blobs=blobs, user="uploader")
    model = small_model(1)
    reused = orphan(registry, "old", model, age=HOUR)
    # Local blobs are an hour old, so a one-minute grace deletes them; moto's LastModified cannot be set back: grace 0.
    grace = "60" if local else "0"
    runs: list[dict] = []

    def gc_beside(
        point: str,
    ) -> None:  # after the staging found the old blobs stored and the gate passed, before the commit
        if point == "after_check":
            runs.append(gc_process(db, blobs, grace))

    with monkeypatch.context() as patch:
        patch.setattr("registry.service.registration.fault_point", gc_beside)
        if upload == "model":
            version = registry.register("new", model).version
        else:
            version = registry.register_stream(
                "new", io.BytesIO(bundle_of(model, tmp_path / "artifact")), 1 << 30
            ).version

    assert len(runs) == 1 and reused == digests_of(version)
    assert set(runs[0]["deleted"]) & reused == set(), "gc deleted blobs the registration was committing"
    assert set(runs[0]["kept_in_flight"]) == reused
    result = registry.verify(rerun_checks=False)
    assert result.passed, result.render_text()
    assert {d for d in reused if registry.store.exists(d)} == reused
    assert set(registry.tensors(version.ref)) == set(version.manifest["tensors"])

    # The lease ended with the commit: once that version is deleted too, gc sweeps the blobs (nothing leaks).
    registry.delete_version(version.ref)
    swept = gc_process(db, blobs, "0")
    assert set(swept["deleted"]) == reused and swept["kept_in_flight"] == []
    registry.meta.close()


@pytest.mark.slow
def test_a_bundle_that_leaves_out_stored_blobs_keeps_them_while_the_version_holding_them_is_deleted(
    where, monkeypatch, tmp_path
):
    """The HTTP upload may leave out blobs a readable version holds; that version may go before the commit."""
    from tests.registry.test_bundle_stream import tar_of

    db, blobs, local = where
    registry = Registry(db=db, blobs=blobs, user="uploader")
    model = small_model(2)
    held = registry.register("old", model).version
    folder = save_artifact_folder(extract_artifact(model), tmp_path / "artifact")
    slim = tar_of([("manifest.json", (folder / "manifest.json").read_bytes())])  # every blob left out
    runs: list[dict] = []

    def delete_then_gc(point: str) -> None:
        if point == "after_check":
            registry.delete_version(held.ref)
            runs.append(gc_process(db, blobs, "0"))

    with monkeypatch.context() as patch:
        patch.setattr("registry.service.registration.fault_point", delete_then_gc)
        version = registry.register_stream(
            "new", io.BytesIO(slim), 1 << 30, reuse=lambda digests: digests & registry.meta.referenced_digests()
        ).version
    assert set(runs[0]["deleted"]) & digests_of(version) == set()
    result = registry.verify(rerun_checks=False)
    assert result.passed, result.render_text()
    registry.meta.close()


def test_a_registration_that_starts_while_gc_is_deleting_waits_and_writes_the_blobs_again(where):
    """The other order: gc decided to delete the old blobs before the registration leased them."""
    db, blobs, local = where
    registry, janitor = Registry(db=db, blobs=blobs, user="uploader"), Registry(db=db, blobs=blobs, user="janitor")
    model = small_model(3)
    reused = orphan(registry, "old", model, age=HOUR)
    deciding, go, outcome = threading.Event(), threading.Event(), {}
    delete = janitor.store.delete

    def delete_after_a_pause(digest: str) -> None:  # the real delete, held back once gc has decided
        deciding.set()
        go.wait(timeout=30)
        delete(digest)

    janitor.store.delete = delete_after_a_pause
    collector = threading.Thread(target=lambda: outcome.setdefault("gc", janitor.gc(grace_seconds=60 if local else 0)))
    collector.start()
    assert deciding.wait(timeout=60)
    registering = threading.Thread(
        target=lambda: outcome.setdefault("version", registry.register("new", model).version)
    )
    registering.start()
    registering.join(timeout=3)  # the registration must not rely on the old blobs while gc is deleting them
    finished_first = not registering.is_alive()
    go.set()
    collector.join(timeout=120)
    registering.join(timeout=120)
    result = registry.verify(rerun_checks=False)
    assert result.passed, result.render_text()
    assert not finished_first, "the registration committed while gc was deleting the blobs it relied on"
    assert set(outcome["gc"].deleted) == reused and all(
        registry.store.exists(d) for d in reused
    )  # deleted, then written again
    assert digests_of(outcome["version"]) == reused
    registry.meta.close()
    janitor.meta.close()


GC_LOOP = """
import json, sys, time
from pathlib import Path
from registry.service import Registry

db, blobs, stop, limit = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
registry = Registry(db=db, blobs=blobs, user="janitor")
print("started", flush=True)
runs = deleted = 0
while runs < limit and not stop.exists():
    runs, deleted = runs + 1, deleted + len(registry.gc(grace_seconds=0).deleted)
print(json.dumps({"runs": runs, "deleted": deleted}))
"""


@pytest.mark.slow
def test_gc_looping_in_another_process_beside_registrations_that_reuse_unreferenced_blobs_loses_nothing(
    where, tmp_path
):
    db, blobs, _ = where
    registry = Registry(db=db, blobs=blobs, user="uploader")
    reused = [small_model(seed) for seed in range(3)]  # stored once, then unreferenced again after every registration
    for seed, model in enumerate(reused):
        orphan(registry, f"seed{seed}", model, age=0)
    stop = tmp_path / "stop"
    janitor = subprocess.Popen(
        [sys.executable, "-c", GC_LOOP, db, blobs, str(stop), "100000"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    kept, broken = [], []
    try:
        assert janitor.stdout.readline().strip() == "started", janitor.stderr.read()[-3000:]
        for i in range(LOOP_REGISTRATIONS):
            keep = i % 5 == 0  # a version that stays, of content nothing else uses (its new blobs race gc too)
            version = registry.register(f"m{i}", small_model(100 + i) if keep else reused[i % len(reused)]).version
            check = registry.verify(version.ref, rerun_checks=False)
            if not check.passed:
                broken.append(check.render_text())
            if keep:
                kept.append(version)
            else:
                registry.delete_version(version.ref)  # its blobs are unreferenced again: the next reuse races gc
    finally:
        stop.touch()
        out, err = janitor.communicate(timeout=120)
    assert janitor.returncode == 0, err[-3000:]
    janitor_report = json.loads(out)
    assert janitor_report["runs"] > LOOP_REGISTRATIONS and janitor_report["deleted"] > 0, (
        janitor_report
    )  # the race really ran
    assert broken == [], broken[0]
    result = registry.verify()
    assert result.passed, result.render_text()
    assert sorted(v.ref for v in kept) == sorted(
        r.ref for name, _, _ in registry.models() for r in registry.versions(name)
    )
    for version in kept:
        assert all(registry.store.exists(d) for d in digests_of(version)), version.ref
    registry.meta.close()
