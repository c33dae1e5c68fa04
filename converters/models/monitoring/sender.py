"""Ships closed windows to the registry from a background thread, with a plain HTTP client (urllib),
never blocking serving.

Windows wait in a bounded queue; when it is full, or the registry cannot be reached, refuses the window or answers
too slowly (`timeout`), the window is dropped and counted, never retried: a window describes minutes of traffic
that the next one describes again, and a serving process must not pile up memory while its registry is down.
Converters never import the registry package: this posts the documented JSON (schemas.monitoring.DriftWindow) to
`POST {server}/api/v1/models/{name}/versions/{n}/drift`.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from schemas import InputFileError
from schemas.monitoring import ServingFault


@dataclass
class SenderStats:
    sent: int = 0
    dropped: int = 0
    rejected: int = 0  # the registry answered 4xx (scope, version, digest): dropped too, and counted apart
    last_error: str | None = None
    last_state: str | None = None
    #: The serving faults the registry stored with the newest window it accepted (schemas.monitoring.ServingFault).
    last_faults: tuple = ()
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


def drift_url(server: str, ref: str) -> str:
    """The endpoint of `ref` ('NAME@N' or 'NAME@alias') on `server`."""
    name, at, version = ref.partition("@")
    if not name or not at or not version:
        raise InputFileError(
            f"ref '{ref}' is not NAME@N; pass the registered version the served model is, e.g. ref='cnn@3'."
        )
    quote = lambda part: urllib.parse.quote(part, safe="")  # noqa: E731
    return f"{server.rstrip('/')}/api/v1/models/{quote(name)}/versions/{quote(version)}/drift"


def _read_answer(answer: str | dict | None) -> tuple[str | None, tuple]:
    """(state, serving faults) of the registry's answer (a WindowRecord), or of a replacement `post`'s plain state."""
    if not isinstance(answer, dict):
        return answer, ()
    faults = []
    for fault in answer.get("faults") or []:
        try:
            faults.append(ServingFault.model_validate(fault))
        except ValueError:
            continue  # a newer registry's kind this collector does not know: the state still says it
    return answer.get("state"), tuple(faults)


class Sender:
    """A daemon thread posting queued window bodies; `post` is replaceable (tests, other transports)."""

    def __init__(
        self,
        url: str | None,
        token: str | None,
        max_pending: int = 8,
        timeout: float = 5.0,
        post: Callable[[dict], str | dict | None] | None = None,
    ):
        self.url, self.token, self.timeout = url, token, timeout
        self.stats = SenderStats()
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._post = post or self._http_post
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="normbridge-monitor-sender", daemon=True)
        self._thread.start()

    def submit(self, body: dict) -> bool:
        """Queue a window without waiting; False (and counted as dropped) when the queue is full."""
        try:
            self._queue.put_nowait(body)
            return True
        except queue.Full:
            self._drop("the send queue is full (the registry is slower than the windows close)")
            return False

    def _drop(self, why: str, rejected: bool = False) -> None:
        with self.stats.lock:
            self.stats.dropped += 1
            self.stats.rejected += int(rejected)
            self.stats.last_error = why

    def _http_post(self, body: dict) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.loads(response.read() or b"{}")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                body = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                answer = self._post(body)
                state, faults = _read_answer(answer)
                with self.stats.lock:
                    self.stats.sent += 1
                    self.stats.last_state, self.stats.last_faults = state, faults
            except urllib.error.HTTPError as error:
                detail = error.read()[:300].decode(errors="replace")
                self._drop(
                    f"the registry refused the window (HTTP {error.code}): {detail}", rejected=400 <= error.code < 500
                )
            except Exception as error:  # unreachable, timeout, reset: drop and count, never raise
                self._drop(f"{type(error).__name__}: {error}"[:300])
            finally:
                self._queue.task_done()

    def wait(self, timeout: float) -> bool:
        """Wait until every queued window was sent or dropped; False if `timeout` seconds passed first."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout: float = 5.0) -> None:
        self.wait(timeout)
        self._stop.set()
        self._thread.join(timeout)


__all__ = ["Sender", "SenderStats", "drift_url"]
