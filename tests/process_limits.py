"""What a test may leave behind and how large a test process may grow (issue 31, item 6), as autouse fixtures.

* A shared gate worker (converters/gate/shared_worker.py) started by a test outlives it for its idle time (10 minutes,
  about 1 GB each): the one whose socket lies in the test's own `tmp_path` is stopped when the test ends, and any other
  started under this process's pytest base folder (a module's worker) when the session ends.
* A test process (pytest itself, or an xdist worker) may not pass MAX_RSS_MB of peak resident memory: the test during
  which the peak crossed it fails, naming the peak. The machine has 2 cores and 24 GB; two workers and the servers they
  start must fit.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

#: The peak resident memory (VmHWM) a test process may reach, in MiB; NORMBRIDGE_TEST_MAX_RSS_MB overrides it. A test
#: whose work alone peaks near it (Keras ConvNeXtTiny's export) runs that work in a child process and checks the
#: child's.
MAX_RSS_MB = int(os.environ.get("NORMBRIDGE_TEST_MAX_RSS_MB", "4096"))
WORKER_MODULE = "converters.gate.shared_worker"


def peak_rss_mb() -> float:
    """This process's peak resident set size (VmHWM) in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def shared_workers() -> dict[int, Path]:
    """pid -> socket path of every shared worker process running now (its first argument after the module name)."""
    found: dict[int, Path] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [word.decode(errors="replace") for word in argv]
        if WORKER_MODULE in words and words.index(WORKER_MODULE) + 1 < len(words):
            found[int(entry.name)] = Path(words[words.index(WORKER_MODULE) + 1])
    return found


def workers_of(folder: Path) -> list[int]:
    """The pids of the shared workers whose socket lies under `folder`."""
    return [pid for pid, socket in shared_workers().items() if socket.is_relative_to(folder)]


def stop_workers_under(folder: Path) -> list[int]:
    """SIGKILL the process group of every shared worker whose socket lies under `folder` (its spread child too)."""
    stopped = []
    for pid in workers_of(folder):
        try:
            os.killpg(pid, signal.SIGKILL)  # a worker leads its own session (start_new_session)
        except (ProcessLookupError, PermissionError):
            continue
        stopped.append(pid)
    return stopped


@pytest.fixture(autouse=True)
def _bounded_test_process(request):
    before = peak_rss_mb()
    yield
    tmp_path = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if isinstance(tmp_path, Path):
        stop_workers_under(tmp_path)
    after = peak_rss_mb()
    if after > MAX_RSS_MB >= before:
        pytest.fail(
            f"this test took its process's peak memory to {after:.0f} MiB (from {before:.0f}), over the "
            f"{MAX_RSS_MB} MiB a test process may use (NORMBRIDGE_TEST_MAX_RSS_MB); free what it holds or make it smaller."
        )


@pytest.fixture(autouse=True, scope="session")
def _no_shared_worker_outlives_the_session(tmp_path_factory):
    yield
    stop_workers_under(tmp_path_factory.getbasetemp())
