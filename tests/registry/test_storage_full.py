"""A registry on a full disk (issue 30, hole 12): a one-line `storage_full` error, exit 25 / HTTP 507,
nothing half written.

Each test mounts a real 2 MiB tmpfs as the registry's home (root only: skipped otherwise, saying why) and registers an
ONNX model of 3 MiB into it: through the library, through real `normbridge register` processes (in process, and handed
to the warm shared worker) and through a real `normbridge serve` (a raw upload and `--server register`'s streamed
bundle). Each failure must name the full store and what to do, leave no version, no blob and no temporary file, and the
registry must work again once there is room (the tmpfs remounted larger, or a filler removed). Before the fix the CLI
printed a Python traceback and exited 1, and the server answered 500.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from registry.service import Registry
from schemas.errors import StorageFullError
from tests.cli_run import run_cli
from tests.http_server import create_token, running_server
from tests.registry.test_service_scale import bn_onnx_bytes, post_model
from tests.process_limits import workers_of

pytestmark = [
    pytest.mark.slow,  # real processes, a real server
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs as the registry's disk needs root"),
]

EXIT_STORAGE_FULL = 25
#: The disk the registry gets, and the model that does not fit on it.
DISK = "2m"
WEIGHT_SHAPE = (96, 8192)  # float32: 3 MiB


@contextmanager
def small_disk(folder: Path, size: str = DISK) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `folder` (created), unmounted afterwards whatever happens."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"mount is not permitted here ({done.stderr.strip()}): a full disk needs a small tmpfs to fill")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], check=True)


def make_room(folder: Path, size: str = "32m") -> None:
    """Grow the tmpfs at `folder`, keeping what it holds: the disk has room again."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True)


def big_onnx(path: Path, seed: int = 0) -> Path:
    """An eval BatchNormalization followed by a MatMul whose 96x8192 float32 weight (3 MiB) fills more than the disk."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    c = 8
    arrays = (
        rng.uniform(0.5, 1.5, c),
        rng.normal(size=c),
        rng.normal(size=c),
        rng.uniform(0.5, 2.0, c),
        rng.normal(size=WEIGHT_SHAPE),
    )
    initializers = [numpy_helper.from_array(a.astype(np.float32), n) for a, n in zip(arrays, ("s", "b", "m", "v", "w"))]
    nodes = [
        helper.make_node("BatchNormalization", ["X", "s", "b", "m", "v"], ["h"], epsilon=1e-5, name="bn"),
        helper.make_node("MatMul", ["h", "w"], ["Y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", c, 4, WEIGHT_SHAPE[0]])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", c, 4, WEIGHT_SHAPE[1]])],
        initializer=initializers,
    )
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]).SerializeToString())
    return path


def stored_files(home: Path) -> set[str]:
    """Every file under the registry's home but the database's own (which holds the audit entry of the refusal)."""
    return {str(p.relative_to(home)) for p in home.rglob("*") if p.is_file() and not p.name.startswith("registry.db")}


def assert_one_line_storage_full(stderr: str, blobs: Path) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert lines[0].startswith(
        f"error (storage_full): the blob store '{blobs}' has no room left (No space left on device)"
    ), lines[0]
    assert "free space on its disk" in lines[0] and "NORMBRIDGE_BLOBS" in lines[0], lines[0]


def assert_refused_and_nothing_written(home: Path, before: set[str], name: str = "big", audited: bool = True) -> None:
    """No version of `name`, no new blob nor temporary file, and (when `audited`) the refusal audited as
    storage_full."""
    registry = Registry(db=f"sqlite:///{home / 'registry.db'}", blobs=str(home / "blobs"))
    try:
        assert name not in [model for model, _, _ in registry.models()]
        assert stored_files(home) == before, sorted(stored_files(home) ^ before)
        assert not [p for p in home.rglob("*.tmp")]
        failures = [entry for entry in registry.audit() if entry.action == "register_failed"]
        if audited:
            assert (failures[-1].model, failures[-1].detail["error"]) == (name, "storage_full")
        else:
            assert not failures
    finally:
        registry.meta.close()


def test_the_library_refuses_a_full_blob_store_then_registers_once_there_is_room(tmp_path):
    model = big_onnx(tmp_path / "big.onnx")
    with small_disk(tmp_path / "home") as home:
        registry = Registry(db=f"sqlite:///{home / 'registry.db'}", blobs=str(home / "blobs"))
        before = stored_files(home)
        with pytest.raises(StorageFullError) as refused:
            registry.register("big", model)
        assert refused.value.code == "storage_full" and refused.value.setting == "NORMBRIDGE_BLOBS"
        assert str(refused.value).startswith(f"the blob store '{home / 'blobs'}' has no room left")
        assert_refused_and_nothing_written(home, before)
        make_room(home)
        done = registry.register("big", model)
        assert done.created and done.version.number == 1 and registry.versions("big")[0].number == 1
        registry.meta.close()


def test_the_library_refuses_a_full_database_then_registers_once_a_filler_is_removed(tmp_path):
    """The database on the full disk, the blobs elsewhere: SQLite's 'database or disk is full' is the same typed
    error."""
    model = tmp_path / "small.onnx"
    model.write_bytes(bn_onnx_bytes(1, channels=4000))
    with small_disk(tmp_path / "home") as home:
        registry = Registry(db=f"sqlite:///{home / 'registry.db'}", blobs=str(tmp_path / "blobs"))
        filler = home / "filler"
        with open(filler, "wb", buffering=0) as out:
            with pytest.raises(OSError):
                while True:
                    out.write(b"\0" * 65536)
        with pytest.raises(StorageFullError) as refused:
            registry.register("small", model)
        message = str(refused.value)
        assert message.startswith(
            f"the registry database '{home / 'registry.db'}' has no room left (database or disk is full)"
        ), message
        assert "NORMBRIDGE_DB" in message and refused.value.setting == "NORMBRIDGE_DB"
        assert registry.models() == [] and list(registry.store.digests()) == []
        filler.unlink()
        assert registry.register("small", model).version.number == 1
        registry.meta.close()


def written_bytes(pid: int) -> int:
    """What process `pid` has written so far (its write calls, files and sockets alike)."""
    return int(dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())["wchar"])


def test_the_cli_in_process_and_through_the_shared_worker_says_one_line_and_exits_25(tmp_path):
    model = big_onnx(tmp_path / "big.onnx")
    (tmp_path / "small.onnx").write_bytes(bn_onnx_bytes(2))
    workers = tmp_path / "workers"
    with small_disk(tmp_path / "home") as home:
        private = {"NORMBRIDGE_HOME": str(home), "NORMBRIDGE_GATE_WORKER": "private"}
        done = run_cli("register", "big", str(model), cwd=tmp_path, env=private)
        assert done.returncode == EXIT_STORAGE_FULL, done.stdout + done.stderr[-3000:]
        assert_one_line_storage_full(done.stderr, home / "blobs")
        assert_refused_and_nothing_written(home, set())

        # The shared worker: the first registration (it fits) starts it, the next is handed to it whole
        # (registry/worker_jobs.py).
        shared = {
            "NORMBRIDGE_HOME": str(home),
            "NORMBRIDGE_GATE_WORKER": "shared",
            "NORMBRIDGE_WORKER_DIR": str(workers),
            "NORMBRIDGE_SPREAD_LEGS": "0",
        }
        try:
            done = run_cli("register", "small", "small.onnx", cwd=tmp_path, env=shared)
            assert done.returncode == 0, done.stderr[-3000:]
            [worker] = workers_of(workers)
            before, written = stored_files(home), written_bytes(worker)
            done = run_cli("register", "big", str(model), cwd=tmp_path, env=shared)
            assert done.returncode == EXIT_STORAGE_FULL, done.stdout + done.stderr[-3000:]
            assert_one_line_storage_full(done.stderr, home / "blobs")
            assert written_bytes(worker) - written > 1_000_000, (
                "the worker did not write the blob: the registration ran elsewhere"
            )
            assert_refused_and_nothing_written(home, before)
            make_room(home)
            done = run_cli("register", "big", str(model), "--json", cwd=tmp_path, env=shared)
            assert done.returncode == 0, done.stderr[-3000:]
            assert json.loads(done.stdout)["version"]["number"] == 1
        finally:
            for pid in workers_of(workers):
                os.kill(pid, 15)


def test_the_server_answers_507_with_the_json_error_for_an_upload_and_a_streamed_bundle(tmp_path):
    """The upload's own temporary file on a full TMPDIR first, then the blob store: 507 `storage_full` each time,
    never a 500."""
    model = big_onnx(tmp_path / "big.onnx")
    with small_disk(tmp_path / "home") as home, small_disk(tmp_path / "uploads") as uploads:
        db, blobs = f"sqlite:///{home / 'registry.db'}", home / "blobs"
        token = create_token(db, "uploader", "write")
        with (
            running_server(db=db, blobs=str(blobs), env={"TMPDIR": str(uploads)}, log=tmp_path / "serve.log") as server,
            httpx.Client(timeout=300) as client,
        ):
            before = stored_files(home)
            response = post_model(client, server.url, token, "big", model.read_bytes())
            assert response.status_code == 507, response.text
            error = response.json()["error"]
            assert (error["code"], error["setting"]) == ("storage_full", "TMPDIR")
            assert (
                error["message"].startswith("the server's folder for uploads has no room left")
                and str(uploads) not in error["message"]
            )
            assert list(uploads.iterdir()) == []  # the upload's folder is removed
            assert_refused_and_nothing_written(home, before, audited=False)  # the model never arrived: nothing to audit
            make_room(uploads)

            response = post_model(client, server.url, token, "big", model.read_bytes())
            assert response.status_code == 507, response.text
            error = response.json()["error"]
            assert (error["code"], error["setting"]) == ("storage_full", "NORMBRIDGE_BLOBS")
            assert error["message"].startswith(f"the blob store '{blobs}' has no room left"), error["message"]
            assert_refused_and_nothing_written(home, before)
            # `--server register` streams a bundle: its blobs are staged as they arrive, and refused the same way
            done = run_cli("--server", server.url, "--token", token, "register", "big", str(model), cwd=tmp_path)
            assert done.returncode == EXIT_STORAGE_FULL, done.stdout + done.stderr[-3000:]
            assert_one_line_storage_full(done.stderr, blobs)
            assert_refused_and_nothing_written(home, before)
            assert "Traceback" not in server.log_text()
            make_room(home)
            response = post_model(client, server.url, token, "big", model.read_bytes())
            assert response.status_code == 201, response.text
