"""The shared leg worker: one warm process per user and code version, serving the gate's legs to every CLI process.

Why: a cold `normbridge register` of a .pt2 needs Keras on TensorFlow for the gate's Keras leg, and
importing them costs 4-7 s of CPU, more than everything else the registration does. A worker that
outlives one CLI process pays that once; later registrations connect to it and pay only their
checks. It runs the same code as a private worker (converters/leg_worker.py: the same `check`, the
same frames), so its results are the ones an in-process check gives, field for field.

Secured as a local service: the socket lives in a folder that must be a real directory owned by this
user with no group or other access (0700, checked before every connection and created so); the
socket file is 0600; the worker accepts a connection only from a peer of its own user id and the
caller talks only to a worker of its own user id (SO_PEERCRED both ways), so nobody else can feed it
requests or answer in its place. Requests are data (a spec's JSON and safetensors bytes, parsed,
never executed), frames longer than `leg_worker.MAX_FRAME` drop the connection. The socket's name is
a digest of everything the results depend on (interpreter, normbridge's code, the frameworks'
installs, KERAS_BACKEND and the adapter packages), so an upgrade or an edit starts a new worker
instead of asking a stale one. A worker with no connection for `idle` seconds removes its socket and
exits; an flock on `<name>.lock` keeps one worker per name.

A worker may also run whole jobs for its callers (`run_job`): the CLI starts it with `--jobs=MODULE`, a module whose
`JOBS` maps names to functions (registry/worker_jobs.py: a registration, so that a CLI process with a warm worker
imports no framework at all), and whose `prepare(frameworks)`, if it has one, readies the worker for the next job of
a model of those frameworks (run after a gate's legs: leg_worker.serve's prepare requests). The module's package is
part of the socket's name, like the code above.

    python -m converters.shared_worker SOCKET IDLE_SECONDS PACKAGES_JSON [--jobs=MODULE] [FRAMEWORK ...]
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
from pathlib import Path

from . import lean_imports
from .adapters import AdapterRegistry
from .leg_client import LegWorker
from .heap import settle_heap
from .leg_worker import ROOT, Job, ProtocolError, read_frame, serve, warm_up, write_frame

#: Seconds a shared worker waits for a new connection after its last one closed before it exits.
DEFAULT_IDLE_SECONDS = 600.0
#: Environment variables that change what a check computes (the Keras backend, TensorFlow's oneDNN kernels) or which code runs.
RESULT_ENV = ("KERAS_BACKEND", "TF_ENABLE_ONEDNN_OPTS", "PYTHONPATH", "CUDA_VISIBLE_DEVICES")
#: Packages whose installed files the results depend on (an upgrade changes the socket's name).
FRAMEWORK_PACKAGES = ("numpy", "ml_dtypes", "torch", "keras", "tensorflow", "onnx", "onnxruntime", "safetensors", "pydantic")
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class WorkerUnavailable(Exception):
    """No shared worker can be used (an unsafe folder, a path too long, a worker that did not start): use a private one."""


def open_folder(folder: Path) -> int:
    """A descriptor of `folder`, created 0700 if missing; it must be a directory (not a link) owned by this user, closed to
    group and others, checked on the descriptor itself (so nothing swaps it after the check). Raises WorkerUnavailable."""
    folder = Path(folder)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as error:
        raise WorkerUnavailable(f"the worker folder '{folder}' is not a directory that can be opened (a link or a file?: {error})") from error
    info = os.fstat(fd)
    problem = None
    if info.st_uid != os.getuid():
        problem = f"belongs to user id {info.st_uid}, not to this user ({os.getuid()})"
    elif info.st_mode & 0o077:
        problem = f"is open to other users (mode {stat.S_IMODE(info.st_mode):o}, expected 700)"
    if problem is not None:
        os.close(fd)
        raise WorkerUnavailable(f"the worker folder '{folder}' {problem}")
    return fd


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


def fingerprint(packages: dict[str, str], jobs: str | None = None) -> str:
    """A digest of what a worker's results depend on: a worker is shared only by callers that agree on all of it (the
    jobs module and its package's code included)."""
    lines = [sys.executable, sys.version, ROOT, json.dumps(packages, sort_keys=True), f"jobs={jobs or ''}"]
    lines += [f"{name}={os.environ.get(name, '')}" for name in RESULT_ENV]
    for package in ("schemas", "converters", *([jobs.split(".")[0]] if jobs else [])):
        lines += sorted(_stat_line(path) for path in (Path(ROOT) / package).rglob("*.py"))
    for name in FRAMEWORK_PACKAGES:
        spec = importlib.util.find_spec(name)  # finds the package without importing it
        lines.append(_stat_line(Path(spec.origin)) if spec is not None and spec.origin else f"{name}:absent")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def socket_path(folder: Path, packages: dict[str, str], jobs: str | None = None) -> Path:
    """Where the shared worker for these adapter packages (and jobs) listens (its name: a digest of what the results depend on)."""
    return Path(folder) / f"legs-{fingerprint(packages, jobs)[:24]}.sock"


def peer_uid(sock: socket.socket) -> int:
    return _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))[1]


def _open(folder_fd: int, path: Path) -> LegWorker | None:
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

    return LegWorker(replies, requests, lambda: sock.fileno() != -1, close, lambda: f"the shared worker (pid {hello['pid']}) hung up",
                     pid=hello["pid"])


def _spawn(path: Path, idle: float, packages: dict[str, str], warm: list[str], jobs: str | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with open(path.with_suffix(".log"), "ab") as log:
        os.chmod(log.fileno(), 0o600)
        argv = [str(path), str(idle), json.dumps(packages), *([f"--jobs={jobs}"] if jobs else []), *warm]
        return subprocess.Popen([sys.executable, "-m", "converters.shared_worker", *argv],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=str(path.parent),
                                start_new_session=True)  # outlives this process, and a Ctrl-C of this one


#: Workers this process started that may not listen yet, by socket path: `connect` waits for one instead of starting another.
_STARTED: dict[Path, subprocess.Popen] = {}


def start(folder: Path, packages: dict[str, str], warm: list[str], idle: float = DEFAULT_IDLE_SECONDS,
          jobs: str | None = None) -> LegWorker | None:
    """A connection to the shared worker of `folder` when one answers now; else one is started (importing `warm`) and None
    returned at once, and `connect` waits for it later. Why: a cold CLI process reads its model meanwhile instead of
    waiting about 0.5 s for the new worker's socket. Raises WorkerUnavailable as `connect` does."""
    folder_fd = open_folder(folder)
    try:
        path = socket_path(folder, packages, jobs)
        worker = _open(folder_fd, path)
        if worker is None and path not in _STARTED:
            _STARTED[path] = _spawn(path, idle, packages, warm, jobs)
        return worker
    finally:
        os.close(folder_fd)


def connect(folder: Path, packages: dict[str, str], warm: list[str], idle: float = DEFAULT_IDLE_SECONDS,
            wait: float = 300.0, jobs: str | None = None) -> LegWorker:
    """A connection to the shared worker of `folder` for these adapter packages (and `jobs`), started (importing `warm`) if
    none runs. Raises WorkerUnavailable when none can be used (the caller then runs a private worker)."""
    folder_fd = open_folder(folder)
    try:
        path = socket_path(folder, packages, jobs)
        worker = _open(folder_fd, path)
        if worker is not None:
            return worker
        process = _STARTED.pop(path, None) or _spawn(path, idle, packages, warm, jobs)
        deadline = time.monotonic() + wait
        delay = 0.02
        while time.monotonic() < deadline:
            worker = _open(folder_fd, path)
            if worker is not None:
                return worker
            if process.poll() not in (None, 0):  # 0: another worker held the lock, and answers in a moment
                raise WorkerUnavailable(f"the shared worker exited with code {process.returncode}; see '{path.with_suffix('.log')}'")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        raise WorkerUnavailable(f"no shared worker answered at '{path}' within {wait:.0f} s")
    finally:
        os.close(folder_fd)


def running(folder: Path, packages: dict[str, str], jobs: str | None = None) -> LegWorker | None:
    """A connection to the shared worker of `folder` for these packages (and jobs) if one is running (none is started)."""
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


def stop(folder: Path, packages: dict[str, str], jobs: str | None = None) -> bool:
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


def run_job(folder: Path, packages: dict[str, str], jobs: str, name: str, args: dict,
            progress: Callable[[list], None] | None = None) -> dict | None:
    """Run job `name` of `jobs` in the shared worker of `folder` if one is running (none is started), passing each progress
    frame to `progress`: its result, or None when no worker answers or it hung up before the result (nothing was done, or
    what was done is all-or-nothing: the caller runs the job itself). Raises the job's error as the caller would have seen it."""
    worker = running(folder, packages, jobs)
    if worker is None:
        return None
    try:
        return worker.run(name, args, progress)
    finally:
        worker.close()


class _Server:
    """The worker's side: accept same-user connections, answer each on its own thread, exit after `idle` seconds alone."""

    def __init__(self, path: Path, idle: float, registry: AdapterRegistry, jobs: dict[str, Job] | None = None,
                 prepare: Callable[[list[str]], None] | None = None):
        self.path, self.idle, self.registry, self.jobs, self.prepare = path, idle, registry, jobs, prepare
        self.check_lock = threading.Lock()  # one check at a time: frameworks build their objects on one thread
        self.count_lock = threading.Lock()
        self.active, self.last_seen = 0, time.monotonic()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def bind(self) -> None:
        self.path.unlink(missing_ok=True)  # a socket left by a worker that was killed (the lock says none runs)
        old = os.umask(0o177)
        try:
            self.listener.bind(self.path.name)  # relative to the folder, this process's working directory: any path length
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
            serve(conn.makefile("rb"), replies, self.registry, self.check_lock, on_shutdown=self.shutdown, jobs=self.jobs,
                  on_prepare=self.prepare)
        except (OSError, ValueError, ProtocolError):
            pass  # a caller that hung up or sent what this protocol never sends: its connection ends
        finally:
            conn.close()
            with self.count_lock:
                self.active -= 1
                self.last_seen = time.monotonic()


def main(argv: list[str]) -> None:
    """argv: the socket path, the idle seconds, the adapter packages (JSON), `--jobs=MODULE` if any, then the frameworks to
    import at once."""
    path, idle, packages, warm = Path(argv[0]), float(argv[1]), json.loads(argv[2]), argv[3:]
    jobs_module = warm.pop(0).removeprefix("--jobs=") if warm and warm[0].startswith("--jobs=") else None
    lock = os.open(path.with_suffix(".lock"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another worker serves this socket
    lean_imports.enable()
    jobs = importlib.import_module(jobs_module) if jobs_module else None
    server = _Server(path, idle, AdapterRegistry(packages), jobs and jobs.JOBS, jobs and getattr(jobs, "prepare", None))
    server.bind()  # callers may connect and queue their requests while the frameworks import
    with server.check_lock:
        threading.Thread(target=server.run, daemon=True).start()
        warm_up(server.registry, warm)
        settle_heap()
        server.last_seen = time.monotonic()
    threading.Event().wait()  # the accept thread exits the process


if __name__ == "__main__":
    main(sys.argv[1:])
