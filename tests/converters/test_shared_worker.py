"""The shared leg worker (converters/shared_worker.py): warm across callers, as strict as an in-process check, closed to others.

Its results are compared field for field with `converters.check` in this process on the whole case table
and on the deliberately broken adapters; its socket is refused to other users both ways (a peer of
another uid is dropped before it is answered, a worker of another uid is never asked), and an
unsafe folder is never used.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time

import pytest

import converters
from converters import shared_worker
from converters.adapters import REGISTRY
from converters.split_check import SplitCheck, share_workers

from tests.converters.test_check import buggy_registry
from tests.converters.test_split_check import ALL_SPECS, in_process_results
from tests.spec_factory import make_spec

pytestmark = pytest.mark.slow  # starts worker processes that import TensorFlow and torch

NOBODY = 65534


def _gone(pid: int, wait: float = 120.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)  # a worker this process started is its child: reap it once it exits
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _stop_all(path, pids) -> None:
    share_workers(None)
    for packages in (REGISTRY.packages, buggy_registry().packages):
        shared_worker.stop(path, packages)
    for pid in pids:
        if not _gone(pid, 30):
            os.kill(pid, 9)


@pytest.fixture
def folder(tmp_path):
    """A worker folder for this test only; every worker started in it is stopped afterwards, and sharing is switched off."""
    path, pids = tmp_path / "workers", []
    yield path, pids
    _stop_all(path, pids)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """One shared worker (Keras and ONNX imported) for the tests that only need a live one: (folder, its pid)."""
    path = tmp_path_factory.mktemp("warm") / "workers"
    worker = shared_worker.connect(path, REGISTRY.packages, ["keras", "onnx"], idle=600)
    worker.close()
    yield path, worker.pid
    _stop_all(path, [worker.pid])


def test_the_shared_workers_legs_equal_in_process_checks_on_the_whole_case_table(warm):
    share_workers(warm[0])
    try:
        got = SplitCheck(in_worker=["keras", "onnx"]).check_all(ALL_SPECS)
    finally:
        share_workers(None)
    for spec, result, expected in zip(ALL_SPECS, got, in_process_results()):
        assert result.model_dump() == expected, spec.name


def test_the_deliberately_broken_adapters_still_fail_in_the_shared_worker(folder):
    path, pids = folder
    share_workers(path, idle_seconds=120)
    registry = buggy_registry()
    specs = [make_spec("layer", eps=1e-3, normalized_shape=(16,), source="torch"), make_spec("batch", source="torch")]
    gate = SplitCheck(registry=registry, in_worker=["torch"])
    got = gate.check_all(specs)
    pids.append(shared_worker.connect(path, registry.packages, []).pid)
    for spec, result in zip(specs, got):
        expected = converters.check(spec, registry=registry)
        assert not result.passed and not expected.passed
        assert result.model_dump() == expected.model_dump()


def test_a_second_caller_finds_the_worker_warm_and_an_idle_worker_exits(folder):
    path, pids = folder
    first = shared_worker.connect(path, REGISTRY.packages, [], idle=3)
    pids.append(first.pid)
    second = shared_worker.connect(path, REGISTRY.packages, [], idle=3)
    assert second.pid == first.pid  # the same process serves both callers
    spec = make_spec("batch", source="torch")
    assert second.submit(spec, ["onnx"]).result().model_dump() == converters.check(spec, frameworks=["onnx"]).model_dump()
    first.close()
    second.close()
    assert _gone(first.pid), "the worker outlived its idle time"
    assert not shared_worker.socket_path(path, REGISTRY.packages).exists()


def test_an_unsafe_folder_is_never_used(tmp_path):
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755)
    open_folder.chmod(0o755)
    with pytest.raises(shared_worker.WorkerUnavailable, match="open to other users"):
        shared_worker.connect(open_folder, REGISTRY.packages, [])
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, NOBODY, NOBODY)
    with pytest.raises(shared_worker.WorkerUnavailable, match="belongs to user id"):
        shared_worker.connect(foreign, REGISTRY.packages, [])
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(shared_worker.WorkerUnavailable, match="not a directory that can be opened"):
        shared_worker.connect(link, REGISTRY.packages, [])
    assert list(open_folder.iterdir()) == list(foreign.iterdir()) == []


def test_a_gate_whose_shared_worker_cannot_be_used_warns_and_gives_the_same_results(tmp_path, folder):
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir(mode=0o777)
    unsafe.chmod(0o777)
    share_workers(unsafe)
    spec = make_spec("batch", source="torch")
    with pytest.warns(RuntimeWarning, match="private worker: the worker folder .* is open to other users"):
        [result] = SplitCheck(in_worker=["onnx"]).check_all([spec])
    assert result.model_dump() == converters.check(spec).model_dump()


def test_a_shared_worker_killed_before_answering_has_its_legs_run_again_in_a_private_one(folder):
    path, pids = folder
    share_workers(path, idle_seconds=60)
    specs = [make_spec("batch", source="torch"), make_spec("layer", source="torch", normalized_shape=(16,))]
    gate = SplitCheck(in_worker=["onnx"])  # connects to (starts) the shared worker
    probe = shared_worker.connect(path, REGISTRY.packages, [])
    pid = probe.pid
    probe.close()
    pids.append(pid)
    os.kill(pid, 9)
    assert _gone(pid)
    got = gate.check_all(specs)
    for spec, result in zip(specs, got):
        assert result.model_dump() == converters.check(spec).model_dump(), spec.name


def _run_as_nobody(action) -> int:
    """Run `action()` in a child process that became user `nobody`; its exit code."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = action()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_the_worker_drops_a_peer_of_another_user_before_answering(warm):
    path, pid = warm
    worker = shared_worker.connect(path, REGISTRY.packages, [])
    assert worker.pid == pid
    sock_path = shared_worker.socket_path(path, REGISTRY.packages)
    os.chmod(path, 0o711)  # let the other user reach the socket file at all: the worker itself must refuse it
    os.chmod(sock_path, 0o666)

    def intrude() -> int:
        os.chdir(path)  # connects by the short relative name (pytest's folders are longer than a socket address holds)
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(sock_path.name)
        header = json.dumps({"frameworks": ["keras"], "spec": {}}).encode()
        try:
            sock.sendall(struct.pack(">Q", len(header)) + header + struct.pack(">Q", 0))
        except OSError:
            return 0  # hung up already
        try:
            return 0 if sock.recv(1) == b"" else 3  # the worker hangs up without a hello or an answer
        except ConnectionResetError:
            return 0

    assert _run_as_nobody(intrude) == 0
    os.chmod(path, 0o700)
    spec = make_spec("batch", source="torch")  # and it still serves its own user
    assert worker.submit(spec, ["keras"]).result().passed
    worker.close()


def test_a_socket_served_by_another_user_is_never_asked(folder, tmp_path):
    path, _ = folder
    folder_fd = shared_worker.open_folder(path)
    address = f"/proc/self/fd/{folder_fd}/{shared_worker.socket_path(path, REGISTRY.packages).name}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)  # bound here, listened on as another user: SO_PEERCRED names that user
    pid = os.fork()
    if pid == 0:
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        listener.listen(4)
        time.sleep(60)
        os._exit(0)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the child listens
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(address)
                break
            except OSError:
                time.sleep(0.05)
            finally:
                probe.close()
        with pytest.raises(shared_worker.WorkerUnavailable, match="another user's process"):
            shared_worker.connect(path, REGISTRY.packages, [])
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        listener.close()
        os.close(folder_fd)


def test_an_oversized_frame_drops_that_connection_only(warm):
    path, pid = warm
    worker = shared_worker.connect(path, REGISTRY.packages, [])
    assert worker.pid == pid
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    folder_fd = shared_worker.open_folder(path)
    sock.connect(f"/proc/self/fd/{folder_fd}/{shared_worker.socket_path(path, REGISTRY.packages).name}")
    os.close(folder_fd)
    sock.recv(4096)  # the hello
    sock.sendall(struct.pack(">Q", 1 << 40))
    assert sock.recv(1) == b""
    sock.close()
    spec = make_spec("rms", source="torch")
    assert worker.submit(spec, ["onnx"]).result().model_dump() == converters.check(spec, frameworks=["onnx"]).model_dump()
    worker.close()


def test_the_socket_name_changes_with_what_the_results_depend_on(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    first = shared_worker.socket_path(tmp_path, REGISTRY.packages)
    assert shared_worker.socket_path(tmp_path, REGISTRY.packages) == first
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert shared_worker.socket_path(tmp_path, REGISTRY.packages) != first
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    assert shared_worker.socket_path(tmp_path, buggy_registry().packages) != first


def test_settling_the_heap_collects_garbage_first_and_then_exempts_what_is_alive():
    """What a worker does after its imports and after each job (converters.heap.settle_heap): garbage is freed, not frozen."""
    import gc
    import weakref

    from converters.heap import settle_heap

    class Node:
        pass

    garbage, alive = Node(), Node()
    garbage.me, alive.me = garbage, alive  # two reference cycles: only a collection frees the first
    gone = weakref.ref(garbage)
    del garbage
    try:
        settle_heap()
        assert gone() is None and gc.get_freeze_count() > 0
        assert not gc.is_tracked(alive) or alive not in gc.get_objects()  # frozen objects leave the collector's generations
    finally:
        gc.unfreeze()


def test_a_started_worker_is_not_waited_for_and_the_gate_connects_to_that_one(folder):
    """shared_worker.start: no worker runs, so one is started and None comes back at once; asking again starts no other,
    and `connect` waits for the one started (what SplitCheck does: start while the model is read, connect at the gate)."""
    path, pids = folder
    assert shared_worker.start(path, REGISTRY.packages, ["onnx"], idle=60) is None
    started = shared_worker._STARTED[shared_worker.socket_path(path, REGISTRY.packages)]
    pids.append(started.pid)
    assert shared_worker.start(path, REGISTRY.packages, ["onnx"], idle=60) is None
    assert list(shared_worker._STARTED.values()).count(started) == 1
    worker = shared_worker.connect(path, REGISTRY.packages, ["onnx"], idle=60)
    assert worker.pid == started.pid and not shared_worker._STARTED
    again = shared_worker.start(path, REGISTRY.packages, ["onnx"], idle=60)  # it runs now: a connection at once
    assert again is not None and again.pid == started.pid
    spec = make_spec("batch", source="torch")
    assert again.submit(spec, ["onnx"]).result().model_dump() == converters.check(spec, frameworks=["onnx"]).model_dump()
    worker.close()
    again.close()


def test_the_warm_up_checks_a_sample_through_every_leg_and_a_broken_adapter_only_fails_it():
    from converters.leg_worker import warm_up

    result = warm_up(REGISTRY, ["keras", "onnx", "torch"])
    assert result is not None and result.passed
    assert [target.framework for target in result.targets] == ["keras", "onnx", "torch"]
    broken = warm_up(buggy_registry(), ["keras", "onnx", "torch"])
    assert broken is None or not broken.passed  # what a broken adapter does to the sample is never raised at a caller


def _maps(pid: int) -> str:
    return open(f"/proc/{pid}/maps").read()


def test_after_a_gate_the_shared_worker_imports_the_models_own_framework_for_the_next_registration(folder):
    """The legs' round trips back to torch run in this process (converters/round_trips.py): the worker has no torch while
    it checks them; once it has answered, it imports torch and its .pt2 reader (a prepare request, answered at once), off
    the gate's clock, so the next registration it runs whole finds them."""
    path, pids = folder
    worker = shared_worker.connect(path, REGISTRY.packages, ["keras", "onnx"], idle=120)
    pids.append(worker.pid)
    worker.close()
    assert "libtorch" not in _maps(pids[0])
    share_workers(path, idle_seconds=120)
    try:
        spec = make_spec("batch", source="torch", name="bn")
        got = SplitCheck(in_worker=["keras", "onnx"]).check_all([spec])[0]
    finally:
        share_workers(None)
    assert got.model_dump() == converters.check(spec).model_dump()
    deadline = time.monotonic() + 120
    while "libtorch" not in _maps(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "libtorch" in _maps(pids[0])
