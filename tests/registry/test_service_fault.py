"""Faults: SIGKILL `normbridge serve` in the middle of an upload and in the middle of the equivalence gate;
a client that hangs up in the middle of its upload.

The registry must be exactly as before: the same models and versions, the same audit entries
(sequence and hashes), no new blob in the store, and a restarted server serves the same state
and gives the next upload the next number (no gap). The kill is a real SIGKILL of the server
process (no cleanup runs); the upload is a real slow streamed HTTP body. The gate window is made
reliable by an 80-layer model (seconds of checks) and detected by its staged blob files.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.http_server import create_token, running_server
from tests.registry.test_service_scale import bearer, bn_onnx_bytes, post_model, server_failures

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

SENT_BEFORE_STALL = 8 * 1024 * 1024


def snapshot(db: str, blobs: str) -> dict:
    """Everything a client could see or gc could touch: versions, aliases, audit entries, blobs,
    hidden staging files."""
    from registry.service import Registry

    registry = Registry(db=db, blobs=blobs, user="inspector")
    try:
        return {
            "models": registry.models(),
            "versions": [
                (r.model, r.number, r.digest, r.content_digest)
                for name, _, _ in registry.models()
                for r in registry.versions(name)
            ],
            "audit": [(e.seq, e.action, e.model, e.number, e.user, e.hash) for e in registry.audit()],
            "blobs": sorted(registry.store.digests()),
            "staging": sorted(str(p.relative_to(blobs)) for p in Path(blobs).rglob(".*.tmp")),
        }
    finally:
        registry.meta.close()


class Disconnect(Exception):
    """Raised inside a request body generator: httpx drops the connection mid-body."""


def cut_off_body(data: bytes, stalled: threading.Event, release: threading.Event):
    """The first SENT_BEFORE_STALL bytes, then a stall (`stalled` is set) until `release`, then a dropped connection."""
    yield data[:SENT_BEFORE_STALL]
    stalled.set()
    release.wait(timeout=60)
    raise Disconnect


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def kill(server) -> None:
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(timeout=30)
    assert server.process.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """Once per module: a SQLite registry whose model 'cnn' has version 1 (registered over HTTP), and a write token."""
    folder = tmp_path_factory.mktemp("template")
    db = f"sqlite:///{folder / 'registry.db'}"
    token = create_token(db, "uploader", "write")
    with (
        running_server(db=db, blobs=str(folder / "blobs"), log=folder / "server.log") as server,
        httpx.Client() as client,
    ):
        response = post_model(client, server.url, token, "cnn", bn_onnx_bytes(1))
        assert response.status_code == 201, response.text
    return folder, token


@pytest.fixture
def registry_with_one_version(template, tmp_path):
    """A private copy of the template registry (database file and blob folder) for one test."""
    folder, token = template
    assert (folder / "registry.db").is_file()
    for database_file in folder.glob("registry.db*"):  # with its -wal/-shm files, if the server left them
        shutil.copyfile(database_file, tmp_path / database_file.name)
    shutil.copytree(folder / "blobs", tmp_path / "blobs")
    return f"sqlite:///{tmp_path / 'registry.db'}", str(tmp_path / "blobs"), token


def assert_unchanged_and_served(db: str, blobs: str, token: str, before: dict, tmp_path: Path) -> None:
    """The registry is as `before`; a restarted server serves it and numbers the next upload 2."""
    after = snapshot(db, blobs)
    assert {k: after[k] for k in ("models", "versions", "audit", "blobs")} == {
        k: before[k] for k in ("models", "versions", "audit", "blobs")
    }
    with (
        running_server(db=db, blobs=blobs, log=tmp_path / "restarted.log") as server,
        httpx.Client(headers=bearer(token), timeout=120) as client,
    ):
        assert client.get(f"{server.url}/api/v1/models").json() == [{"name": "cnn", "latest": 1, "versions": 1}]
        listed = client.get(f"{server.url}/api/v1/models/cnn/versions").json()["versions"]
        assert [(v["model"], v["number"], v["digest"], v["content_digest"]) for v in listed] == before["versions"]
        audit = client.get(f"{server.url}/api/v1/audit", params={"verify": "true"}).json()
        assert audit["chain_ok"] is True and [e["seq"] for e in audit["entries"]] == [e[0] for e in before["audit"]]
        response = post_model(client, server.url, token, "cnn", bn_onnx_bytes(2))
        assert response.status_code == 201 and response.json()["version"]["number"] == 2, response.text


def test_sigkill_during_a_streamed_upload_leaves_the_registry_unchanged(registry_with_one_version, tmp_path):
    db, blobs, token = registry_with_one_version
    before = snapshot(db, blobs)
    assert before["models"] == [("cnn", 1, 1)] and before["blobs"]
    upload_tmp = tmp_path / "server-tmp"
    upload_tmp.mkdir()
    data = bn_onnx_bytes(3, channels=2_000_000)  # ~32 MB of real ONNX; only the first 8 MiB is sent
    stalled, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def body():
        yield data[: SENT_BEFORE_STALL // 2]
        yield data[SENT_BEFORE_STALL // 2 : SENT_BEFORE_STALL]
        stalled.set()
        release.wait(timeout=120)  # the server dies meanwhile
        yield data[SENT_BEFORE_STALL:]

    with running_server(db=db, blobs=blobs, env={"TMPDIR": str(upload_tmp)}, log=tmp_path / "killed.log") as server:

        def send():
            try:
                with httpx.Client() as client:
                    outcome["response"] = client.post(
                        f"{server.url}/api/v1/models/cnn/versions",
                        params={"format": "onnx"},
                        content=body(),
                        headers={**bearer(token), "Content-Type": "application/octet-stream"},
                        timeout=120,
                    )
            except httpx.HTTPError as error:
                outcome["error"] = error

        sender = threading.Thread(target=send)
        sender.start()
        stalled.wait(timeout=60)

        def receiving() -> bool:  # the server has started writing the body to its temp file
            return any(p.stat().st_size > 0 for p in upload_tmp.glob("normbridge-upload-*/upload.onnx"))

        wait_for(receiving, 60, "the server to receive part of the upload")
        kill(server)
        release.set()
        sender.join(timeout=60)
    assert "response" not in outcome, (
        f"the killed server answered: {outcome['response'].status_code} {outcome['response'].text[:300]}"
    )
    assert isinstance(outcome.get("error"), httpx.HTTPError)
    # the partial body is only in the dead server's temp folder, never in the registry
    partial = list(upload_tmp.glob("normbridge-upload-*/upload.onnx"))
    assert len(partial) == 1 and 0 < partial[0].stat().st_size < len(data)
    assert snapshot(db, blobs)["staging"] == []
    assert_unchanged_and_served(db, blobs, token, before, tmp_path)


def test_sigkill_during_the_equivalence_gate_leaves_the_registry_unchanged(registry_with_one_version, tmp_path):
    db, blobs, token = registry_with_one_version
    before = snapshot(db, blobs)
    assert before["models"] == [("cnn", 1, 1)] and before["staging"] == []
    # 80 BatchNorm layers: the gate checks each one, seconds in all, while its blobs wait as hidden staging files
    data = bn_onnx_bytes(4, layers=80)
    outcome: dict = {}
    with running_server(db=db, blobs=blobs, log=tmp_path / "killed.log") as server:

        def send():
            try:
                with httpx.Client() as client:
                    outcome["response"] = post_model(client, server.url, token, "cnn", data)
            except httpx.HTTPError as error:
                outcome["error"] = error

        sender = threading.Thread(target=send)
        sender.start()
        wait_for(lambda: any(Path(blobs).rglob(".*.tmp")), 120, "the upload's blobs to be staged (the gate is running)")
        kill(server)
        sender.join(timeout=60)
    assert "response" not in outcome, f"the gate finished before the kill: {outcome['response'].status_code}"
    left = snapshot(db, blobs)
    assert left["staging"], "the kill should leave the staged blobs of the interrupted registration"
    assert_unchanged_and_served(db, blobs, token, before, tmp_path)
    # gc removes what the dead registration staged; nothing referenced is touched
    from registry.service import Registry

    from tests.registry.test_registry_service import expire_leases

    registry = Registry(db=db, blobs=blobs, user="janitor")
    leased = registry.gc(grace_seconds=0)  # the dead registration's blob lease keeps its staged files until it expires
    assert leased.staging_removed == 0 and snapshot(db, blobs)["staging"] == left["staging"]
    assert expire_leases(registry) > 0
    swept = registry.gc(grace_seconds=0)
    assert swept.deleted == [] and swept.staging_removed >= len(left["staging"])
    assert snapshot(db, blobs)["staging"] == []
    assert registry.verify(rerun_checks=False).passed
    registry.meta.close()


def test_a_client_that_disconnects_mid_upload_leaves_nothing_behind(registry_with_one_version, tmp_path):
    db, blobs, token = registry_with_one_version
    before = snapshot(db, blobs)
    upload_tmp = tmp_path / "server-tmp"
    upload_tmp.mkdir()
    data = bn_onnx_bytes(5, channels=2_000_000)
    stalled, release = threading.Event(), threading.Event()

    def body():
        return cut_off_body(data, stalled, release)

    def receiving() -> bool:
        return any(p.stat().st_size > 0 for p in upload_tmp.glob("normbridge-upload-*/upload.onnx"))

    with running_server(db=db, blobs=blobs, env={"TMPDIR": str(upload_tmp)}, log=tmp_path / "server.log") as server:
        outcome: dict = {}

        def send():
            try:
                with httpx.Client() as client:
                    outcome["response"] = client.post(
                        f"{server.url}/api/v1/models/cnn/versions",
                        params={"format": "onnx"},
                        content=body(),
                        headers={**bearer(token), "Content-Type": "application/octet-stream"},
                        timeout=60,
                    )
            except Disconnect as error:
                outcome["error"] = error

        sender = threading.Thread(target=send)
        sender.start()
        stalled.wait(timeout=60)
        wait_for(receiving, 60, "the server to receive part of the upload")
        release.set()
        sender.join(timeout=60)
        assert isinstance(outcome.get("error"), Disconnect), outcome
        # the server notices, removes the partial body and registers nothing; it keeps serving
        wait_for(
            lambda: not list(upload_tmp.glob("normbridge-upload-*")), 30, "the server to remove the partial upload"
        )
        with httpx.Client(headers=bearer(token), timeout=60) as client:
            assert client.get(f"{server.url}/api/v1/models").json() == [{"name": "cnn", "latest": 1, "versions": 1}]
        assert server.process.poll() is None
    after = snapshot(db, blobs)
    assert after == before  # not even an audit entry: nothing reached the registry
    assert server_failures(server.log_text()) == [], server.log_text()[-3000:]


def bundle_body(seed: int, folder: Path) -> bytes:
    """An artifact bundle (10 BatchNorm layers, ~32 MB) as `normbridge --server URL register FOLDER` sends it."""
    import onnx

    from registry.artifact import extract_artifact
    from registry.manifest_io import save_artifact_folder
    from registry.client_transfer import folder_tar_chunks

    model = onnx.load_from_string(bn_onnx_bytes(seed, channels=200_000, layers=10))
    artifact = save_artifact_folder(extract_artifact(model), folder / f"bundle-{seed}")
    return b"".join(folder_tar_chunks(artifact, lambda done: None))


@pytest.mark.parametrize("fault", ["client disconnects", "server is killed"])
def test_a_bundle_cut_off_mid_stream_leaves_the_registry_unchanged(registry_with_one_version, tmp_path, fault):
    """Bundles are registered while they stream in: the first blobs are already staged when the stream stops."""
    db, blobs, token = registry_with_one_version
    before = snapshot(db, blobs)
    data = bundle_body(7, tmp_path)
    stalled, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def body():
        return cut_off_body(data, stalled, release)

    def staged() -> bool:
        return any(Path(blobs).rglob(".*.tmp"))

    with running_server(db=db, blobs=blobs, log=tmp_path / "server.log") as server:

        def send():
            try:
                with httpx.Client() as client:
                    outcome["response"] = post_model(client, server.url, token, "cnn", body(), fmt="bundle")
            except (Disconnect, httpx.HTTPError) as error:
                outcome["error"] = error

        sender = threading.Thread(target=send)
        sender.start()
        stalled.wait(timeout=60)
        wait_for(staged, 60, "the server to stage the bundle's first blobs")
        if fault == "server is killed":
            kill(server)
        release.set()
        sender.join(timeout=60)
        assert "response" not in outcome, f"the server answered a cut-off bundle: {outcome['response'].status_code}"
        if fault == "client disconnects":
            wait_for(lambda: not staged(), 30, "the server to discard what it had staged")
            with httpx.Client(headers=bearer(token), timeout=60) as client:
                assert client.get(f"{server.url}/api/v1/models").json() == [{"name": "cnn", "latest": 1, "versions": 1}]
            assert server.process.poll() is None
            assert server_failures(server.log_text()) == [], server.log_text()[-3000:]
    if fault == "client disconnects":
        assert snapshot(db, blobs) == before  # not even an audit entry: no registration was attempted
    else:
        assert snapshot(db, blobs)["staging"], "the kill leaves the staged blobs, for gc"
        assert_unchanged_and_served(db, blobs, token, before, tmp_path)
