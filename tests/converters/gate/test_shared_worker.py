"""The shared check worker (converters/gate/shared_worker.py): warm across callers,
as strict as an in-process check, closed to others.

Its results are compared field for field with `converters.check` in this process on the whole case table
and on the deliberately broken adapters; its socket is refused to other users both ways (a peer of
another uid is dropped before it is answered, a worker of another uid is never asked), an
unsafe folder is never used, a folder swapped in after the check is never used either (the race of issue
30, run as a second user), no worker imports from the folder it starts in, and a worker takes only the
listed environment, all of which names its socket.
"""

from __future__ import annotations

import ctypes
import grp
import json
import os
import pwd
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import converters
from converters.gate import shared_worker
from converters.adapters import REGISTRY
from converters.gate.worker_client import start_child
from converters.gate.split_check import SharedWorker, SplitCheck

from tests.converters.test_check import buggy_registry
from tests.converters.gate.test_split_check import ALL_SPECS, in_process_results
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
    for packages in (REGISTRY.packages, buggy_registry().packages):
        shared_worker.stop(path, packages)
    for pid in pids:
        if not _gone(pid, 30):
            os.kill(pid, 9)


@pytest.fixture
def folder(tmp_path):
    """A worker folder for this test only; every worker started in it is stopped afterwards."""
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
    got = SplitCheck(in_worker=["keras", "onnx"], shared=SharedWorker(warm[0])).check_all(ALL_SPECS)
    for spec, result, expected in zip(ALL_SPECS, got, in_process_results()):
        assert result.model_dump() == expected, spec.name


def test_the_deliberately_broken_adapters_still_fail_in_the_shared_worker(folder):
    path, pids = folder
    registry = buggy_registry()
    specs = [make_spec("layer", eps=1e-3, normalized_shape=(16,), source="torch"), make_spec("batch", source="torch")]
    gate = SplitCheck(registry=registry, in_worker=["torch"], shared=SharedWorker(path, idle=120))
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
    assert (
        second.submit(spec, ["onnx"]).result().model_dump() == converters.check(spec, frameworks=["onnx"]).model_dump()
    )
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
    spec = make_spec("batch", source="torch")
    with pytest.warns(RuntimeWarning, match="private worker: the worker folder .* is open to other users"):
        [result] = SplitCheck(in_worker=["onnx"], shared=SharedWorker(unsafe)).check_all([spec])
    assert result.model_dump() == converters.check(spec).model_dump()


def test_a_shared_worker_killed_before_answering_has_its_legs_run_again_in_a_private_one(folder):
    path, pids = folder
    specs = [make_spec("batch", source="torch"), make_spec("layer", source="torch", normalized_shape=(16,))]
    gate = SplitCheck(in_worker=["onnx"], shared=SharedWorker(path, idle=60))  # connects to (starts) the shared worker
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
    assert (
        worker.submit(spec, ["onnx"]).result().model_dump() == converters.check(spec, frameworks=["onnx"]).model_dump()
    )
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
    """What a worker does after its imports and after each job (converters.heap.settle_heap): garbage is freed,
    not frozen."""
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
        assert (
            not gc.is_tracked(alive) or alive not in gc.get_objects()
        )  # frozen objects leave the collector's generations
    finally:
        gc.unfreeze()


def test_a_started_worker_is_not_waited_for_and_the_gate_connects_to_that_one(folder):
    """shared_worker.start: no worker runs, so one is started and None comes back at once; asking again starts no other,
    and `connect` waits for the one started (what SplitCheck does: start while the model is read, connect at the
    gate)."""
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
    assert (
        again.submit(spec, ["onnx"]).result().model_dump() == converters.check(spec, frameworks=["onnx"]).model_dump()
    )
    worker.close()
    again.close()


def test_the_warm_up_checks_a_sample_through_every_leg_and_a_broken_adapter_only_fails_it():
    from converters.gate.check_worker import warm_up

    result = warm_up(REGISTRY, ["keras", "onnx", "torch"])
    assert result is not None and result.passed
    assert [target.framework for target in result.targets] == ["keras", "onnx", "torch"]
    broken = warm_up(buggy_registry(), ["keras", "onnx", "torch"])
    assert broken is None or not broken.passed  # what a broken adapter does to the sample is never raised at a caller


def _maps(pid: int) -> str:
    return open(f"/proc/{pid}/maps").read()


def test_after_a_gate_the_shared_worker_imports_the_models_own_framework_for_the_next_registration(folder):
    """The legs' round trips back to torch run in this process (converters/gate/round_trips.py): the worker has no torch
    while it checks them; once it has answered, it imports torch and its .pt2 reader (a prepare request, answered at
    once), off the gate's clock, so the next registration it runs whole finds them."""
    path, pids = folder
    worker = shared_worker.connect(path, REGISTRY.packages, ["keras", "onnx"], idle=120)
    pids.append(worker.pid)
    worker.close()
    assert "libtorch" not in _maps(pids[0])
    spec = make_spec("batch", source="torch", name="bn")
    got = SplitCheck(in_worker=["keras", "onnx"], shared=SharedWorker(path, idle=120)).check_all([spec])[0]
    assert got.model_dump() == converters.check(spec).model_dump()
    deadline = time.monotonic() + 120
    while "libtorch" not in _maps(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "libtorch" in _maps(pids[0])


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: the attacker below only calls into it
IN_OPEN, IN_ISDIR, RENAME_EXCHANGE, AT_FDCWD = 0x20, 0x40000000, 2, -100
EVIL_PACKAGE = "import os\nopen({marker!r}, 'w').write(str(os.getuid()))\nos._exit(7)\n"


def _unused_id() -> int:
    """A user and group id with no passwd or group entry: the other team member, made without touching /etc."""
    for candidate in range(64000, 64500):
        try:
            pwd.getpwuid(candidate)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(candidate)
        except KeyError:
            return candidate
    pytest.skip("no unused user id in 64000-64499 for the second user")


def _swap_on_open(home: Path, marker: Path, member: int, ready: int) -> int:
    """The other team member (a forked child that became `member`): plant `evil/converters/__init__.py`, watch the
    shared home with inotify and, when the victim opens `workers/`, exchange it with `evil/` (renameat2
    RENAME_EXCHANGE). 0 when it swapped them."""
    os.setgroups([])
    os.setgid(member)
    os.setuid(member)
    evil = home / "evil"
    (evil / "converters").mkdir(parents=True)
    (evil / "converters" / "__init__.py").write_text(EVIL_PACKAGE.format(marker=str(marker)))
    watch = _LIBC.inotify_init1(os.O_CLOEXEC)
    if watch < 0 or _LIBC.inotify_add_watch(watch, os.fsencode(home), IN_OPEN) < 0:
        return 2
    os.write(ready, b"r")
    deadline = time.monotonic() + 60
    while (left := deadline - time.monotonic()) > 0 and select.select([watch], [], [], left)[0]:
        events, offset = os.read(watch, 65536), 0
        while offset < len(events):
            _, mask, _, size = struct.unpack_from("iIII", events, offset)
            name, offset = events[offset + 16 : offset + 16 + size].rstrip(b"\0"), offset + 16 + size
            if name == b"workers" and mask & IN_ISDIR:
                swapped = _LIBC.renameat2(
                    AT_FDCWD, os.fsencode(home / "workers"), AT_FDCWD, os.fsencode(evil), RENAME_EXCHANGE
                )
                return 0 if swapped == 0 else 4
    return 3


def _race_once(base: Path, member: int) -> tuple[int, str, int | None]:
    """One registration's worker spawn in a team's shared home (2775, group `member`) while `member` swaps `workers/`:
    (the attacker's exit code, what the marker holds ('' when absent), the worker's pid if one answered)."""
    home, marker = base / "home", base / "marker"
    home.mkdir()
    os.chown(home, 0, member)
    home.chmod(0o2775)
    (home / "workers").mkdir(mode=0o700)
    ready_r, ready_w = os.pipe()
    attacker = os.fork()
    if attacker == 0:
        code = 1
        try:
            os.close(ready_r)
            code = _swap_on_open(home, marker, member, ready_w)
        finally:
            os._exit(code)
    os.close(ready_w)
    pid = None
    try:
        assert select.select([ready_r], [], [], 30)[0] and os.read(ready_r, 1) == b"r", (
            "the attacker did not start watching"
        )
        try:
            worker = shared_worker.connect(home / "workers", REGISTRY.packages, [], idle=30, wait=60)
            pid = worker.pid
            worker.close()
        except shared_worker.WorkerUnavailable:
            pass  # today's code: the attacker's package ran instead of the worker, which then "exited with code 7"
        deadline = time.monotonic() + 30
        while (done := os.waitpid(attacker, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        if done[0] == 0:
            os.kill(attacker, 9)
            os.waitpid(attacker, 0)
            swapped = -1
        else:
            swapped = os.waitstatus_to_exitcode(done[1])
    finally:
        os.close(ready_r)
        if pid is not None and not _gone_after_kill(pid):
            raise AssertionError(f"the worker {pid} did not stop")
    return swapped, marker.read_text() if marker.exists() else "", pid


def _gone_after_kill(pid: int) -> bool:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass
    return _gone(pid, 30)


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="the race needs a second local user: only root can become one (setuid) without a passwd entry",
)
def test_another_member_of_a_shared_home_who_swaps_the_worker_folder_during_the_spawn_runs_no_code():
    """Issue 30, hole 6: a team shares NORMBRIDGE_HOME (2775); another member exchanges `workers/` with a folder of
    their own holding `converters/__init__.py` the moment the victim opens it (after the folder check, before the
    spawn). The worker must start in the folder that was checked and never import from it: no marker, over several
    tries, and each try's swap did happen."""
    member = _unused_id()
    outcomes = []
    for _ in range(4):
        base = Path(tempfile.mkdtemp(prefix="nb-swap-", dir="/tmp"))
        try:
            base.chmod(0o711)  # the other member reaches the shared home inside, and nothing else here
            outcomes.append(_race_once(base, member))
        finally:
            shared_worker._STARTED.clear()
            shutil.rmtree(base, ignore_errors=True)
    assert [swapped for swapped, _, _ in outcomes] == [0] * 4, "the attacker did not get to swap the folders"
    assert [marker for _, marker, _ in outcomes] == [""] * 4, (
        "the other member's converters/__init__.py ran as this user"
    )
    assert all(pid is not None for _, _, pid in outcomes), "the worker did not start in the folder that was checked"


def test_a_private_worker_started_in_a_folder_holding_a_converters_package_runs_the_installed_one(
    tmp_path, monkeypatch
):
    """`python -m` puts the working directory first on sys.path: a gate worker started from a folder holding a
    `converters/` package (a download, a shared /tmp) must still run normbridge's own code."""
    marker = tmp_path / "marker"
    (tmp_path / "converters").mkdir()
    (tmp_path / "converters" / "__init__.py").write_text(EVIL_PACKAGE.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    worker = start_child([], REGISTRY.packages)
    try:
        spec = make_spec("batch", source="torch")
        got = worker.submit(spec, ["onnx"]).result(timeout=120)
    finally:
        worker.close()
    assert not marker.exists()
    assert got.model_dump() == converters.check(spec, frameworks=["onnx"]).model_dump()


def _environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().partition("=")[::2] for entry in entries if entry)


def _shut_down(worker) -> None:
    worker.send({"shutdown": True}, b"").exception(timeout=60)  # it hangs up as it exits: stopped either way
    worker.close()


def test_a_caller_with_other_settings_reaches_a_worker_of_its_own_which_takes_only_the_listed_variables(
    folder, monkeypatch
):
    """The shared worker kept the environment of the CLI that started it for every later caller: now its environment is
    what `worker_environment` takes from its caller, and all of it names the socket."""
    path, pids = folder
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("NORMBRIDGE_TOKEN", "nbt_0123456789ab_secret")  # the caller's own: never handed to a worker
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    first = shared_worker.connect(path, REGISTRY.packages, [], idle=60)
    pids.append(first.pid)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    second = shared_worker.connect(path, REGISTRY.packages, [], idle=60)
    pids.append(second.pid)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("NORMBRIDGE_TOKEN", "nbt_ba9876543210_other")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    again = shared_worker.connect(path, REGISTRY.packages, [], idle=60)  # differs only in what no worker takes
    try:
        assert second.pid != first.pid and again.pid == first.pid
        first_env, second_env = _environ(first.pid), _environ(second.pid)
        assert (first_env["OMP_NUM_THREADS"], second_env["OMP_NUM_THREADS"]) == ("1", "2")
        assert "NORMBRIDGE_TOKEN" not in first_env and "AWS_SECRET_ACCESS_KEY" not in first_env
        assert first_env == shared_worker.worker_environment()
        spec = make_spec("batch", source="torch")
        assert (
            second.submit(spec, ["onnx"]).result().model_dump()
            == converters.check(spec, frameworks=["onnx"]).model_dump()
        )
    finally:
        again.close()
        _shut_down(first)
        _shut_down(second)


def test_importing_the_frameworks_does_not_change_the_environment_that_names_the_socket():
    """A CLI process names the worker before it imports its model's framework (`start`) and after (`connect`): what
    Keras and TensorFlow set in the environment on import (torch sets nothing) must not name another worker."""
    script = (
        "from converters.gate import shared_worker as w\n"
        "before = w.worker_environment()\n"
        "from converters.keras_adapter.runtime import import_keras; import_keras()\n"
        "from converters import lean_imports; lean_imports.enable()\n"
        "print(before == w.worker_environment())"
    )
    env = {key: value for key, value in os.environ.items() if key not in ("KERAS_BACKEND", "NORMBRIDGE_LEAN_IMPORTS")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(converters.__file__).parent.parent,
    )
    assert done.stdout.strip() == "True", done.stderr[-2000:]
