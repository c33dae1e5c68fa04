"""Started servers and concurrent HTTP reads for the service benchmarks (bench/service.py): processes, load, warm-up."""

from __future__ import annotations

import http.client
import os
import json
import subprocess
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .processes import stop_process_group, wait_for_http


@dataclass
class Process:
    name: str
    url: str
    process: subprocess.Popen
    log: Path

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""


@contextmanager
def started(
    name: str,
    command: list[str],
    port: int,
    ready_path: str,
    folder: Path,
    env: dict | None = None,
    timeout: float = 180.0,
):
    """Run `command` (which listens on `port`) until the block ends; wait until GET ready_path answers 200."""
    log = folder / f"{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=folder,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    handle = Process(name, f"http://127.0.0.1:{port}", process, log)
    try:
        wait_for_http(handle.url + ready_path, process, timeout, handle.tail, name)
        yield handle
    finally:
        stop_process_group(process, grace=20)


def request_json(method: str, url: str, body: dict | None = None, headers: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read() or b"{}")


# ---------------------------------------------------------------------------- read load


@dataclass
class LoadResult:
    requests: int
    errors: int
    seconds: float
    latencies: list[float]  # seconds, one per successful request

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else float("nan")


def read_load(url: str, path: str, headers: dict, clients: int, seconds: float, check=None) -> LoadResult:
    """`clients` threads, each on one keep-alive connection, GET `path` back to back for `seconds`."""
    host, port = url.removeprefix("http://").split(":")
    stop_at = [0.0]
    start_gate = threading.Barrier(clients + 1)
    results: list[tuple[int, int, list[float]]] = []
    lock = threading.Lock()

    def client() -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        done = errors = 0
        latencies: list[float] = []
        start_gate.wait()
        while True:
            began = time.perf_counter()
            if began >= stop_at[0]:
                break
            try:
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
                body = response.read()
                if response.status != 200 or (check is not None and not check(body)):
                    errors += 1
                else:
                    done += 1
                    latencies.append(time.perf_counter() - began)
            except (OSError, http.client.HTTPException):
                errors += 1
                connection.close()
                connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.close()
        with lock:
            results.append((done, errors, latencies))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    stop_at[0] = began + seconds
    start_gate.wait()
    for thread in threads:
        thread.join(timeout=seconds + 60)
    elapsed = time.perf_counter() - began
    return LoadResult(
        sum(r[0] for r in results), sum(r[1] for r in results), elapsed, [x for r in results for x in r[2]]
    )


def warm(url: str, path: str, headers: dict, count: int = 50) -> None:
    """A few sequential requests first: imports, caches and connection pools are not what we measure."""
    for _ in range(count):
        request = urllib.request.Request(url + path, headers=headers)
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
