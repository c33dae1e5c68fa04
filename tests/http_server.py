"""A real `normbridge serve` process on a free loopback port, for tests that speak HTTP to it.

`running_server(db=..., blobs=...)` starts the installed command in a new process, waits until
GET /api/v1/health answers, yields a `Server` (base URL, process, log file) and stops it
afterwards. `create_token(db, owner, role)` mints a token with the real `normbridge token create` (in this process
unless asked for a process).
Nothing is mocked: requests go over TCP to uvicorn.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli
from testkit.processes import free_port, stop_process_group, wait_for_http

__all__ = ["Server", "create_token", "free_port", "running_server", "writer_server"]


@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT (no trailing slash)
    process: subprocess.Popen
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextmanager
def running_server(
    *,
    db: str,
    blobs: str,
    args: Sequence[str] = (),
    env: dict | None = None,
    log: Path | None = None,
    timeout: float = 90.0,
) -> Iterator[Server]:
    """Start `normbridge serve` on 127.0.0.1 (free port) against `db` and `blobs`; stop it on exit."""
    port = free_port()
    log = log or Path(os.environ.get("TMPDIR", "/tmp")) / f"normbridge-serve-{port}.log"
    command = [
        *normbridge_command(),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--db",
        db,
        "--blobs",
        blobs,
        *args,
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
        )
    server = Server(url=f"http://127.0.0.1:{port}", process=process, log=log)
    try:
        wait_for_http(f"{server.url}/api/v1/health", process, timeout, server.log_text, "normbridge serve")
        yield server
    finally:
        stop_process_group(process)


def create_token(db: str, owner: str, role: str, models: Sequence[str] = (), *, process: bool = False) -> str:
    """A new token from the real `normbridge token create ... --json` (its secret is printed once).

    The console script's app runs in this process (tests.cli_run.invoke_cli: same parsing, command and store) unless
    `process`: minting is set-up for most tests, and a real process costs 2-4 s; tests/registry/http/test_http_auth.py
    mints one token with a real process.
    """
    args = ["token", "create", "--db", db, "--owner", owner, "--role", role, "--json"]
    for model in models:
        args += ["--model", model]
    if process:
        done = subprocess.run([*normbridge_command(), *args], capture_output=True, text=True, timeout=120)
    else:
        done = invoke_cli(*args, cwd=Path.cwd())
    if done.returncode != 0:
        raise RuntimeError(f"normbridge token create failed ({done.returncode}): {done.stderr}{done.stdout}")
    return json.loads(done.stdout)["token"]


@contextmanager
def writer_server(root: Path, owner: str) -> Iterator[tuple]:
    """A `normbridge serve` on a fresh SQLite registry under `root` and an httpx client holding `owner`'s write token:
    (client, db, blobs)."""
    import httpx

    db, blobs = f"sqlite:///{root / 'registry.db'}", str(root / "blobs")
    token = create_token(db, owner, "write")
    with running_server(db=db, blobs=blobs, log=root / "serve.log") as running:
        with httpx.Client(base_url=running.url, headers={"Authorization": f"Bearer {token}"}, timeout=300) as client:
            yield client, db, blobs
