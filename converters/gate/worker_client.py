"""The caller's side of a check worker (converters/gate/check_worker.py): requests sent, replies read back into results.

Why apart: the caller (the gate, converters/gate/split_check.py; the shared worker's connections,
converters/gate/shared_worker.py) needs only this and the frames, not the worker's serving code.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import BinaryIO

from schemas import CheckResult, NormSpec
from schemas.spec_io import spec_to_json, tensors_to_bytes

from . import round_trips
from .check_worker import ROOT, ProtocolError, error_from, read_frame, write_frame


class WorkerGone(RuntimeError):
    """The worker ended (killed, out of memory) before it answered: nothing was checked there."""


class WorkerConnection:
    """The caller's side of one worker: requests are written by a thread of their own (a worker still importing its
    frameworks reads nothing, and the caller must not wait on a full pipe meanwhile) and answered in order."""

    def __init__(
        self,
        replies: BinaryIO,
        requests: BinaryIO,
        alive: Callable[[], bool],
        close: Callable[[], None],
        last_words: Callable[[], str],
        pid: int | None = None,
    ):
        self._replies, self._requests = replies, requests
        self._alive, self._close, self._last_words = alive, close, last_words
        self.pid = pid  #: the worker's process id (the benchmarks read its CPU time)
        self._lock = threading.Lock()
        self._ended = False
        self._pending: list[tuple[Future, Callable[[list], None] | None]] = []
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._write_requests, name="normbridge-worker-requests", daemon=True).start()
        threading.Thread(target=self._read_replies, name="normbridge-worker-replies", daemon=True).start()

    def submit(self, spec: NormSpec, frameworks: list[str], defer_round_trips: bool = False) -> Future:
        """A future CheckResult of `check(spec, frameworks)` run in the worker; with `defer_round_trips`, a future
        round_trips.Checked whose round trips the caller runs (equivalence.finish_round_trips)."""
        header = {"frameworks": frameworks, "spec": json.loads(spec_to_json(spec)), **_deferral(defer_round_trips)}
        return self.send(header, tensors_to_bytes(spec))

    def submit_many(self, specs: list[NormSpec], frameworks: list[str], defer_round_trips: bool = False) -> Future:
        """A future list of CheckResults (of round_trips.Checked with `defer_round_trips`): `check_many(specs,
        frameworks)` run in the worker in one request. Why: one spec per request costs the worker about 8 ms per spec
        against 5 for the same checks grouped by configuration."""
        blobs = [tensors_to_bytes(spec) for spec in specs]
        header = {
            "frameworks": frameworks,
            "specs": [json.loads(spec_to_json(spec)) for spec in specs],
            "sizes": [len(b) for b in blobs],
            **_deferral(defer_round_trips),
        }
        return self.send(header, b"".join(blobs))

    def warm(self, frameworks: list[str]) -> Future:
        """Ask the worker to import `frameworks` now (a shared worker started for another model's frameworks)."""
        return self.send({"warm": list(frameworks)}, b"")

    def prepare(self, frameworks: list[str]) -> Future:
        """Ask the worker to import `frameworks` and what reading their models imports, after the requests sent before;
        answered at once (nobody need wait for it): a shared worker then runs the next registration of such a model
        warm."""
        return self.send({"prepare": list(frameworks)}, b"")

    def run(self, job: str, args: dict, progress: Callable[[list], None] | None = None) -> dict | None:
        """Run a job of a shared worker (its `serve(jobs=...)`) and wait: its result, None if the worker ended before it
        answered. Raises the job's error."""
        try:
            return self.send({"job": job, "args": args}, b"", progress).result()
        except WorkerGone:
            return None

    def send(self, header: dict, tensors: bytes, progress: Callable[[list], None] | None = None) -> Future:
        """A future of the reply to one request (a CheckResult, a job's result, None for the others); `progress` is
        given each progress frame answered before it (a job's)."""
        future: Future = Future()
        with self._lock:
            if self._ended:  # the reply reader has stopped: nothing would ever answer this request
                future.set_exception(WorkerGone(f"the check's worker process had ended: {self._last_words()}"))
                return future
            self._pending.append((future, progress))
            self._outbox.put((json.dumps(header).encode(), tensors))
        return future

    def _write_requests(self) -> None:
        while (frames := self._outbox.get()) is not None:
            try:
                for frame in frames:
                    write_frame(self._requests, frame)
                self._requests.flush()
            except (OSError, ValueError):
                return  # the worker is gone: the reply reader fails every pending request with its last words

    def _read_replies(self) -> None:
        while True:
            try:
                reply = read_frame(self._replies)
            except (OSError, ValueError, ProtocolError):
                reply = None
            fields = None if reply is None else json.loads(reply)
            with self._lock:
                if fields is None:
                    pending, self._pending, self._ended = self._pending, [], True
                    break
                if "progress" in fields:
                    told = self._pending[0][1]
                else:
                    future, told = self._pending.pop(0)[0], None
            if "progress" in fields:
                if told is not None:
                    try:
                        told(fields["progress"])
                    except Exception:  # noqa: BLE001  a progress display that fails must not lose the answer
                        pass
                continue
            if "error" in fields:
                future.set_exception(error_from(fields["error"]))
            elif "result" in fields:
                future.set_result(_checked(fields["result"], fields.get("round_trips")))
            elif "results" in fields:
                trips = fields.get("round_trips") or [None] * len(fields["results"])
                future.set_result(
                    [_checked(result, spec_trips) for result, spec_trips in zip(fields["results"], trips)]
                )
            elif "done" in fields:
                future.set_result(fields["done"])
            else:
                future.set_result(None)
        error = WorkerGone(f"the check's worker process ended before answering: {self._last_words()}")
        for future, _ in pending:
            future.set_exception(error)

    def alive(self) -> bool:
        return not self._ended and self._alive()

    def close(self) -> None:
        """Stop writing and let go of the worker (a child is ended, a shared worker only disconnected)."""
        self._outbox.put(None)
        self._close()


def _deferral(defer_round_trips: bool) -> dict:
    return {"defer_round_trips": True} if defer_round_trips else {}


def _checked(result: dict, trips: list | None) -> CheckResult | round_trips.Checked:
    """A reply's result: a CheckResult, or with its deferred round trips (`trips`, sent when asked for) a Checked."""
    checked = CheckResult.model_validate(result)
    return (
        checked
        if trips is None
        else round_trips.Checked(checked, [round_trips.RoundTrip.from_fields(trip) for trip in trips])
    )


def python_path() -> str:
    """PYTHONPATH for a worker: ROOT first (it runs this copy of normbridge), then the caller's own entries made
    absolute (as the caller resolved them; an empty entry, which would mean the worker's working directory, is
    dropped)."""
    entries = [os.path.abspath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return os.pathsep.join(dict.fromkeys([ROOT, *entries]))  # a worker's own workers: ROOT once


def python_command(module: str) -> list[str]:
    """argv that runs `module` as a worker. `-P`: `python -m` would put the working directory first on sys.path, so a
    `converters/` package in the folder a worker starts from (a download, a shared /tmp, a swapped worker folder) would
    run instead of normbridge's; the worker finds normbridge through `python_path` alone."""
    return [sys.executable, "-P", "-m", module]


def start_child(warm: list[str], packages: dict[str, str]) -> WorkerConnection:
    """A worker that is this process's child on pipes, importing `warm` at once; it ends with its caller."""
    env = {**os.environ, "PYTHONPATH": python_path()}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    stderr = tempfile.TemporaryFile()
    process = subprocess.Popen(
        [*python_command("converters.gate.check_worker"), json.dumps(packages), *warm],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env,
    )

    def last_words() -> str:
        stderr.seek(0)
        lines = stderr.read().decode(errors="replace").strip().splitlines()
        return f"exit code {process.wait()}: " + (lines[-1] if lines else "it printed nothing")

    def close() -> None:
        # End it now and reap it: it holds no state worth a graceful exit, and one still importing TensorFlow (a
        # registration that failed before its gate) would otherwise keep its caller waiting seconds at exit.
        try:
            process.stdin.close()
        except OSError:
            pass
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()

    return WorkerConnection(
        process.stdout, process.stdin, lambda: process.poll() is None, close, last_words, process.pid
    )


__all__ = ["WorkerConnection", "WorkerGone", "python_command", "python_path", "start_child"]
