"""Servers in child processes, for tests and benchmarks: a free loopback port, readiness over HTTP, a clean stop.

Each server runs in its own session (process group), so stopping it also stops the workers it
forked (uvicorn --workers, gunicorn, huey consumers).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(
    url: str,
    process: subprocess.Popen,
    timeout: float,
    log_text: Callable[[], str],
    name: str = "server",
    since: float | None = None,
) -> None:
    """Return once GET `url` answers 200; RuntimeError with the server's log if it exits or `timeout` passes."""
    deadline = (time.monotonic() if since is None else since) + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not answer {url} within {timeout:.0f} s:\n{log_text()}")
        time.sleep(0.2)


def stop_process_group(process: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the process group of `process` (started with start_new_session=True), SIGKILL whatever lingers."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)
    try:  # workers that outlived their parent
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
