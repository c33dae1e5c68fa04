"""The shared check worker: one warm process per user and code version, serving the gate's legs to every CLI process.

Why: a cold `normbridge register` of a .pt2 needs Keras on TensorFlow for the gate's Keras leg, and
importing them costs 4-7 s of CPU, more than everything else the registration does. A worker that
outlives one CLI process pays that once; later registrations connect to it and pay only their
checks. It runs the same code as a private worker (converters/gate/check_worker.py: the same `check`, the
same frames), so its results are the ones an in-process check gives, field for field.

Secured as a local service: the socket lives in a folder that must be a real directory owned by this
user with no group or other access (0700, checked before every connection and created so). After the
check the folder is reached through the checked descriptor only, never by its path again: its parent may
be writable by others (a team's NORMBRIDGE_HOME), who could swap the folder in between. Connections go
through `/proc/self/fd`, the log is opened relative to the descriptor with O_NOFOLLOW, and the worker is
handed the descriptor, makes it its working directory (fchdir) and binds, locks and unlinks by name there;
it runs with `-P`, so no working directory is ever on its sys.path (worker_client.python_command). The socket
file is 0600; the worker accepts a connection only from a peer of its own user id and the
caller talks only to a worker of its own user id (SO_PEERCRED both ways), so nobody else can feed it
requests or answer in its place. Requests are data (a spec's JSON and safetensors bytes, parsed,
never executed), frames longer than `check_worker.MAX_FRAME` drop the connection. The socket's name is
a digest of everything the results depend on (interpreter, normbridge's code, the frameworks'
installs, the adapter packages and the environment the worker takes: `worker_environment`), so an
upgrade, an edit or a caller with other settings starts a new worker instead of asking a stale one. A
worker with no connection for `idle` seconds removes its socket and exits; an flock on `<name>.lock`
keeps one worker per name.

A worker may also run whole jobs for its callers (`run_job`). The caller registers them: it passes a `JobSource`, a
function of its own that returns the jobs (`WorkerJobs`: names to functions, and a `prepare(frameworks)` that readies
the worker for the next job of a model of those frameworks, run after a gate's legs: check_worker.serve's prepare
requests). The worker process is started with the function's reference (`--jobs=MODULE:NAME`, from the function the
caller passed, never a name written here) and calls it once; the function's package is part of the socket's name, like
the code above. The CLI registers a registration so (a CLI process with a warm worker then imports no framework).

    python -P -m converters.gate.shared_worker SOCKET IDLE_SECONDS PACKAGES_JSON [--folder-fd=FD] [--jobs=MODULE:NAME] [FRAMEWORK ...]

(SOCKET's folder is the descriptor FD when given, else SOCKET's folder, checked as `open_folder` does.)
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import lean_imports
from ..adapters import AdapterRegistry
from .worker_client import WorkerConnection, python_command, python_path
from ..heap import settle_heap
from .check_worker import ROOT, Job, ProtocolError, read_frame, serve, warm_up, write_frame


@dataclass(frozen=True)
class WorkerJobs:
    """The jobs a shared worker runs for its callers (by name) and what readies it for the next one (or None)."""

    jobs: dict[str, Job]
    prepare: Callable[[list[str]], None] | None = None


#: A caller's registration of its jobs: a module-level function, importable where the worker runs, returning them.
JobSource = Callable[[], WorkerJobs]


def jobs_reference(source: JobSource | None) -> str | None:
    """`MODULE:NAME` of a JobSource, as the worker is told it (None for none). Raises ValueError for a function the
    worker could not import (a local function, one of `__main__`)."""
    if source is None:
        return None
    module, name = getattr(source, "__module__", None), getattr(source, "__qualname__", "")
    if not module or module == "__main__" or not name or "<" in name:
        raise ValueError(f"a shared worker's jobs come from a module-level function it can import, not {source!r}")
    return f"{module}:{name}"


def _load_jobs(reference: str) -> WorkerJobs:
    """The jobs of the JobSource `reference` names (the caller's own function, passed when it started the worker)."""
    module, _, name = reference.partition(":")
    source = importlib.import_module(module)
    for part in name.split("."):
        source = getattr(source, part)
    return source()


#: Seconds a shared worker waits for a new connection after its last one closed before it exits.
DEFAULT_IDLE_SECONDS = 600.0
#: The environment a worker takes from the caller that starts it: these names, and names with these prefixes (the
#: frameworks' and thread pools' settings, normbridge's own). Nothing else reaches it (no credentials, no token), and
#: all of it is part of the socket's name, so a caller whose values differ starts, or reaches, a worker of its own.
WORKER_ENV_NAMES = (
    "HOME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "PYTHONWARNINGS",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "XLA_FLAGS",
)
WORKER_ENV_PREFIXES = (
    "NORMBRIDGE_",
    "KERAS_",
    "TF_",
    "CUDA_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "TORCH_",
    "PYTORCH_",
    "ORT_",
    "LC_",
)
#: normbridge settings the caller resolves itself (the store, the user and the options travel in each job's request) or
#: that choose the worker or a server: not taken, so callers that differ only in them share a worker.
CALLER_ONLY_ENV = (
    "NORMBRIDGE_DB",
    "NORMBRIDGE_BLOBS",
    "NORMBRIDGE_HOME",
    "NORMBRIDGE_USER",
    "NORMBRIDGE_S3_ENDPOINT",
    "NORMBRIDGE_SERVER",
    "NORMBRIDGE_TOKEN",
    "NORMBRIDGE_GATE_WORKER",
    "NORMBRIDGE_WORKER_DIR",
    "NORMBRIDGE_WORKER_IDLE",
    "NORMBRIDGE_REGISTER_IN_WORKER",
    "NORMBRIDGE_FAULT",
    "NORMBRIDGE_VERBOSE",
)
#: What a worker's own code sets when unset (keras_adapter.runtime, lean_imports), applied first so that a caller that
#: has not set them yet (it imports Keras later) names the same worker as one that has.
WORKER_ENV_DEFAULTS = {"KERAS_BACKEND": "tensorflow", "NORMBRIDGE_LEAN_IMPORTS": "1"}
#: The same for every worker: it runs no program by name, and its log is for its errors.
WORKER_ENV_FIXED = {"PATH": os.defpath, "TF_CPP_MIN_LOG_LEVEL": "2"}
#: Packages whose installed files the results depend on (an upgrade changes the socket's name), around each framework's
#: own (its FrameworkInfo.worker_packages): `result_packages`.
ARRAY_PACKAGES, SPEC_PACKAGES = ("numpy", "ml_dtypes"), ("safetensors", "pydantic")


def result_packages(packages: dict[str, str]) -> tuple[str, ...]:
    """Every package whose installed files the results of a worker for these adapter packages depend on."""
    frameworks = (name for info in AdapterRegistry(packages).infos() for name in info.worker_packages)
    return (*ARRAY_PACKAGES, *frameworks, *SPEC_PACKAGES)


_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class WorkerUnavailable(Exception):
    """No shared worker can be used (an unsafe folder, a path too long, a worker that did not start):
    use a private one."""


def open_folder(folder: Path) -> int:
    """A descriptor of `folder`, created 0700 if missing; it must be a directory (not a link) owned by this user, closed
    to group and others, checked on the descriptor itself (so nothing swaps it after the check).
    Raises WorkerUnavailable."""
    folder = Path(folder)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise WorkerUnavailable(
            f"the worker folder '{folder}' is not a directory that can be opened (a link or a file?: {error})"
        ) from error
    _check_folder(fd, folder)
    return fd


def _check_folder(fd: int, folder: Path) -> None:
    """Raise WorkerUnavailable (closing `fd`) unless the directory of `fd` is this user's and closed to group and
    others."""
    info = os.fstat(fd)
    problem = None
    if info.st_uid != os.getuid():
        problem = f"belongs to user id {info.st_uid}, not to this user ({os.getuid()})"
    elif info.st_mode & 0o077:
        problem = f"is open to other users (mode {stat.S_IMODE(info.st_mode):o}, expected 700)"
    if problem is not None:
        os.close(fd)
        raise WorkerUnavailable(f"the worker folder '{folder}' {problem}")


def _address(folder_fd: int, name: str) -> str:
    """The socket's address through the checked folder's descriptor: short whatever the folder's path (Unix socket
    addresses hold 108 bytes) and always inside the folder that was checked."""
    return f"/proc/self/fd/{folder_fd}/{name}"


def _stat_line(path: Path) -> str:
    try:
        info = path.stat()
        return f"{path}:{info.st_size}:{info.st_mtime_ns}"
    except OSError:
        return f"{path}:missing"


def worker_environment() -> dict[str, str]:
    """The environment a worker started now gets: the caller's variables it takes (WORKER_ENV_*, never CALLER_ONLY_ENV),
    the defaults and fixed values, and PYTHONPATH with ROOT first and the caller's entries absolute."""
    taken = {
        name: value
        for name, value in os.environ.items()
        if (name in WORKER_ENV_NAMES or name.startswith(WORKER_ENV_PREFIXES)) and name not in CALLER_ONLY_ENV
    }
    return {**WORKER_ENV_DEFAULTS, **taken, **WORKER_ENV_FIXED, "PYTHONPATH": python_path()}


def fingerprint(packages: dict[str, str], jobs: JobSource | None = None) -> str:
    """A digest of what a worker's results depend on: a worker is shared only by callers that agree on all of it (the
    jobs' function and its package's code, and the environment it would get, included)."""
    jobs = jobs_reference(jobs)
    lines = [sys.executable, sys.version, ROOT, json.dumps(packages, sort_keys=True), f"jobs={jobs or ''}"]
    lines += [f"env {name}={value}" for name, value in sorted(worker_environment().items())]
    for package in ("schemas", "converters", *([jobs.split(".")[0]] if jobs else [])):
        lines += sorted(_stat_line(path) for path in (Path(ROOT) / package).rglob("*.py"))
    for name in result_packages(packages):
        spec = importlib.util.find_spec(name)  # finds the package without importing it
        lines.append(_stat_line(Path(spec.origin)) if spec is not None and spec.origin else f"{name}:absent")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def socket_path(folder: Path, packages: dict[str, str], jobs: JobSource | None = None) -> Path:
    """Where the shared worker for these adapter packages (and jobs) listens
    (its name: a digest of what the results depend on)."""
    return Path(folder) / f"legs-{fingerprint(packages, jobs)[:24]}.sock"


def peer_uid(sock: socket.socket) -> int:
    return _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))[1]


def _open(folder_fd: int, path: Path) -> WorkerConnection | None:
    """A connection to the worker at `path` (in the folder of `folder_fd`), or None when none answers there.
    Raises WorkerUnavailable for a foreign worker."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(_address(folder_fd, path.name))
    except OSError:
        sock.close()
        return None
    if peer_uid(sock) != os.getuid():
        sock.close()
        raise WorkerUnavailable(f"the socket '{path}' is served by another user's process; it is not asked anything")
    replies, requests = sock.makefile("rb"), sock.makefile("wb")
    try:
        hello = json.loads(read_frame(replies, limit=4096) or b"null")
    except (OSError, ValueError, ProtocolError):
        hello = None
    if not isinstance(hello, dict) or hello.get("worker") != path.name:
        sock.close()
        return None  # a worker that exited while this connection waited in its queue: start another

    def close() -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for stream in (requests, replies, sock):
            try:
                stream.close()
            except OSError:
                pass

    return WorkerConnection(
        replies,
        requests,
        lambda: sock.fileno() != -1,
        close,
        lambda: f"the shared worker (pid {hello['pid']}) hung up",
        pid=hello["pid"],
    )


def _spawn(
    folder_fd: int, path: Path, idle: float, packages: dict[str, str], warm: list[str], jobs: JobSource | None
) -> subprocess.Popen:
    """Start the worker in the folder of `folder_fd`, the one that was checked: its log is opened relative to the
    descriptor, and the worker gets the descriptor itself (its working directory is `/` until it fchdirs there), so a
    folder swapped in at `path` since the check is never used."""
    log = os.open(
        path.with_suffix(".log").name,
        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=folder_fd,
    )
    try:
        os.fchmod(log, 0o600)
        argv = [
            str(path),
            str(idle),
            json.dumps(packages),
            f"--folder-fd={folder_fd}",
            *([f"--jobs={jobs_reference(jobs)}"] if jobs else []),
            *warm,
        ]
        return subprocess.Popen(
            [*python_command("converters.gate.shared_worker"), *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=worker_environment(),
            cwd="/",
            pass_fds=(folder_fd,),
            start_new_session=True,
        )  # outlives this process, and a Ctrl-C of this one
    finally:
        os.close(log)


#: Workers this process started that may not listen yet, by socket path: `connect` waits for one instead of starting
#: another.
_STARTED: dict[Path, subprocess.Popen] = {}


def start(
    folder: Path,
    packages: dict[str, str],
    warm: list[str],
    idle: float = DEFAULT_IDLE_SECONDS,
    jobs: JobSource | None = None,
) -> WorkerConnection | None:
    """A connection to the shared worker of `folder` when one answers now; else one is started (importing `warm`) and
    None returned at once, and `connect` waits for it later. Why: a cold CLI process reads its model meanwhile instead
    of waiting about 0.5 s for the new worker's socket. Raises WorkerUnavailable as `connect` does."""
    folder_fd = open_folder(folder)
    try:
        path = socket_path(folder, packages, jobs)
        worker = _open(folder_fd, path)
        if worker is None and path not in _STARTED:
            _STARTED[path] = _spawn(folder_fd, path, idle, packages, warm, jobs)
        return worker
    finally:
        os.close(folder_fd)


def connect(
    folder: Path,
    packages: dict[str, str],
    warm: list[str],
    idle: float = DEFAULT_IDLE_SECONDS,
    wait: float = 300.0,
    jobs: JobSource | None = None,
) -> WorkerConnection:
    """A connection to the shared worker of `folder` for these adapter packages (and `jobs`), started (importing `warm`)
    if none runs. Raises WorkerUnavailable when none can be used (the caller then runs a private worker)."""
    folder_fd = open_folder(folder)
    try:
        path = socket_path(folder, packages, jobs)
        worker = _open(folder_fd, path)
        if worker is not None:
            return worker
        process = _STARTED.pop(path, None) or _spawn(folder_fd, path, idle, packages, warm, jobs)
        deadline = time.monotonic() + wait
        delay = 0.02
        while time.monotonic() < deadline:
            worker = _open(folder_fd, path)
            if worker is not None:
                return worker
            if process.poll() not in (None, 0):  # 0: another worker held the lock, and answers in a moment
                raise WorkerUnavailable(
                    f"the shared worker exited with code {process.returncode}; see '{path.with_suffix('.log')}'"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        raise WorkerUnavailable(f"no shared worker answered at '{path}' within {wait:.0f} s")
    finally:
        os.close(folder_fd)


def running(folder: Path, packages: dict[str, str], jobs: JobSource | None = None) -> WorkerConnection | None:
    """A connection to the shared worker of `folder` for these packages (and jobs) if one is running
    (none is started)."""
    try:
        folder_fd = open_folder(folder)
    except WorkerUnavailable:
        return None
    try:
        return _open(folder_fd, socket_path(folder, packages, jobs))
    except WorkerUnavailable:
        return None
    finally:
        os.close(folder_fd)


def stop(folder: Path, packages: dict[str, str], jobs: JobSource | None = None) -> bool:
    """Ask the shared worker of `folder` for these packages (and jobs) to exit now; whether one was running."""
    worker = running(folder, packages, jobs)
    if worker is None:
        return False
    future = worker.send({"shutdown": True}, b"")
    try:
        future.result(timeout=60)
    except Exception:  # it hung up while stopping: stopped all the same
        pass
    worker.close()
    return True


def run_job(
    folder: Path,
    packages: dict[str, str],
    jobs: JobSource,
    name: str,
    args: dict,
    progress: Callable[[list], None] | None = None,
) -> dict | None:
    """Run job `name` of `jobs` in the shared worker of `folder` if one is running (none is started), passing each
    progress frame to `progress`: its result, or None when no worker answers or it hung up before the result (nothing
    was done, or what was done is all-or-nothing: the caller runs the job itself).
    Raises the job's error as the caller would have seen it."""
    worker = running(folder, packages, jobs)
    if worker is None:
        return None
    try:
        return worker.run(name, args, progress)
    finally:
        worker.close()


class _Server:
    """The worker's side: accept same-user connections, answer each on its own thread,
    exit after `idle` seconds alone."""

    def __init__(
        self,
        path: Path,
        idle: float,
        registry: AdapterRegistry,
        jobs: dict[str, Job] | None = None,
        prepare: Callable[[list[str]], None] | None = None,
    ):
        """`path`: the socket's name, relative to the worker folder, this process's working directory."""
        self.path, self.idle, self.registry, self.jobs, self.prepare = path, idle, registry, jobs, prepare
        self.check_lock = threading.Lock()  # one check at a time: frameworks build their objects on one thread
        self.count_lock = threading.Lock()
        self.active, self.last_seen = 0, time.monotonic()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def bind(self) -> None:
        self.path.unlink(missing_ok=True)  # a socket left by a worker that was killed (the lock says none runs)
        old = os.umask(0o177)
        try:
            self.listener.bind(
                str(self.path)
            )  # relative to the checked folder, this process's working directory: any path length
        finally:
            os.umask(old)
        self.listener.listen(64)
        self.listener.settimeout(1.0)

    def exit(self) -> None:
        self.path.unlink(missing_ok=True)
        os._exit(0)

    def shutdown(self) -> None:
        """Asked to stop: after the check running now, if any (its caller gets its answer first)."""
        self.check_lock.acquire()
        self.exit()  # TensorFlow's teardown takes seconds and nobody waits for it

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                with self.count_lock:
                    if self.active == 0 and time.monotonic() - self.last_seen > self.idle:
                        self.exit()
                continue
            conn.settimeout(None)
            if peer_uid(conn) != os.getuid():
                conn.close()  # another user's process: refused before it sends a byte
                continue
            with self.count_lock:
                self.active += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            replies = conn.makefile("wb")
            write_frame(replies, json.dumps({"worker": self.path.name, "pid": os.getpid()}).encode())
            replies.flush()
            serve(
                conn.makefile("rb"),
                replies,
                self.registry,
                self.check_lock,
                on_shutdown=self.shutdown,
                jobs=self.jobs,
                on_prepare=self.prepare,
            )
        except (OSError, ValueError, ProtocolError):
            pass  # a caller that hung up or sent what this protocol never sends: its connection ends
        finally:
            conn.close()
            with self.count_lock:
                self.active -= 1
                self.last_seen = time.monotonic()


def _enter_folder(path: Path, folder_fd: int | None) -> None:
    """Make the checked worker folder this process's working directory: the descriptor the caller checked and handed
    over, else `path`'s folder, opened and checked here. Every name below is relative to it."""
    if folder_fd is None:
        folder_fd = open_folder(path.parent)
    else:
        _check_folder(folder_fd, path.parent)
    os.fchdir(folder_fd)
    os.close(folder_fd)


def main(argv: list[str]) -> None:
    """argv: the socket path (only its name is used, in the folder of `--folder-fd`), the idle seconds, the adapter
    packages (JSON), `--folder-fd=FD` and `--jobs=MODULE:NAME` (the callers' JobSource) if any,
    then the frameworks to import at once."""
    path, idle, packages, warm = Path(argv[0]), float(argv[1]), json.loads(argv[2]), argv[3:]
    options = {}
    while warm and warm[0].startswith("--"):
        key, _, value = warm.pop(0).partition("=")
        options[key] = value
    try:
        _enter_folder(path, int(options["--folder-fd"]) if "--folder-fd" in options else None)
    except WorkerUnavailable as reason:
        sys.exit(f"normbridge shared worker: {reason}")
    jobs_named = options.get("--jobs")
    name = Path(path.name)
    lock = os.open(name.with_suffix(".lock"), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another worker serves this socket
    lean_imports.enable()
    jobs = _load_jobs(jobs_named) if jobs_named else None
    server = _Server(name, idle, AdapterRegistry(packages), jobs and jobs.jobs, jobs and jobs.prepare)
    server.bind()  # callers may connect and queue their requests while the frameworks import
    with server.check_lock:
        threading.Thread(target=server.run, daemon=True).start()
        warm_up(server.registry, warm)
        settle_heap()
        server.last_seen = time.monotonic()
    threading.Event().wait()  # the accept thread exits the process


if __name__ == "__main__":
    main(sys.argv[1:])
