"""A real `normbridge serve` process on a free loopback port, for tests that speak HTTP to it.

`running_server(db=..., blobs=...)` starts the installed command in a new process, waits until
GET /api/v1/health answers, yields a `Server` (base URL, process, log file) and stops it
afterwards. `create_token(db, owner, role)` mints a token with the real `normbridge token create`.
Nothing is mocked: requests go over TCP to uvicorn.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.cli_process import normbridge_command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT (no trailing slash)
    process: subprocess.Popen
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextmanager
def running_server(*, db: str, blobs: str, args: Sequence[str] = (), env: dict | None = None, log: Path | None = None,
                   timeout: float = 90.0) -> Iterator[Server]:
    """Start `normbridge serve` on 127.0.0.1 (free port) against `db` and `blobs`; stop it on exit."""
    port = free_port()
    log = log or Path(os.environ.get("TMPDIR", "/tmp")) / f"normbridge-serve-{port}.log"
    command = [*normbridge_command(), "serve", "--host", "127.0.0.1", "--port", str(port), "--db", db, "--blobs", blobs, *args]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    server = Server(url=f"http://127.0.0.1:{port}", process=process, log=log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"normbridge serve exited with {process.returncode}:\n{server.log_text()}")
            try:
                with urllib.request.urlopen(f"{server.url}/api/v1/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"normbridge serve did not answer within {timeout} s:\n{server.log_text()}")
            time.sleep(0.2)
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def create_token(db: str, owner: str, role: str, models: Sequence[str] = ()) -> str:
    """A new token from the real `normbridge token create ... --json` (its secret is printed once)."""
    command = [*normbridge_command(), "token", "create", "--db", db, "--owner", owner, "--role", role, "--json"]
    for model in models:
        command += ["--model", model]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"normbridge token create failed ({done.returncode}): {done.stderr}{done.stdout}")
    return json.loads(done.stdout)["token"]
