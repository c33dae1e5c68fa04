"""A real `mlflow server` process on a free loopback port, for tests of the MLflow bridge.

`running_mlflow_server(folder)` starts the installed MLflow tracking server (SQLite backend and
proxied artifacts, both under `folder`) and stops the whole process group afterwards. The server
takes 20-40 s to boot on a loaded box, so readiness is lazy: `server.url` waits until GET /health
answers, letting a test build its models while the server starts. The `mlflow_server` fixture
wraps it for one test module.
Nothing is mocked: the bridge talks HTTP to the server MLflow users run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testkit.processes import free_port, stop_process_group, wait_for_http

SCRIPT = Path(sys.executable).parent / "mlflow"


@dataclass
class MlflowServer:
    base: str  # http://127.0.0.1:PORT
    process: subprocess.Popen
    log: Path
    timeout: float
    started: float = field(default_factory=time.monotonic)
    ready: bool = False

    @property
    def url(self) -> str:
        """The base URL, once the server answers GET /health (RuntimeError with its log if it never does)."""
        if not self.ready:
            self._wait()
        return self.base

    def _wait(self) -> None:
        wait_for_http(
            f"{self.base}/health", self.process, self.timeout, self.log_text, "mlflow server", since=self.started
        )
        self.ready = True

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextmanager
def running_mlflow_server(folder: Path, timeout: float = 120.0) -> Iterator[MlflowServer]:
    """`mlflow server` on 127.0.0.1 with its database and artifacts under `folder` (ready on first `.url`);
    stopped on exit."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    artifacts = folder / "artifacts"
    prefix = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "mlflow"]
    command = [
        *prefix,
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{folder / 'mlflow.db'}",
        "--artifacts-destination",
        str(artifacts),
    ]
    log = folder / "mlflow-server.log"
    with open(log, "wb") as out:
        # A new session: the server forks workers, and teardown must stop all of them, not only the parent.
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=folder,
            start_new_session=True,
            env={**os.environ, "MLFLOW_TRACKING_URI": ""},
        )
    server = MlflowServer(base=f"http://127.0.0.1:{port}", process=process, log=log, timeout=timeout)
    try:
        yield server
    finally:
        stop_process_group(process, grace=5)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> Iterator[MlflowServer]:
    """One real MLflow tracking server per test module."""
    with running_mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server
