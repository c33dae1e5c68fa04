"""The serving collector: `monitor(model, server=..., token=..., ref="NAME@N")` watches a served model's BatchNorm inputs.

A fraction `sample_rate` of requests is sampled; for those, each BatchNorm input's per-channel mean and variance are
merged into the open window (window.py). A window closes every `window_requests` requests or `window_seconds` seconds,
whichever comes first, and is queued for the background sender (sender.py), which posts it to the registry. Nothing
here blocks or fails a request: the taps catch their own errors (counted in `stats().errors`), a full queue or an
unreachable registry drops the window (counted in `stats().dropped`), and the request path only takes a short lock.

The model adapter instruments the model (ModelAdapter.serving_taps): a torch nn.Module keeps serving itself with
hooks; an ExportedProgram is served as `monitor.served` (its module with taps); an onnxruntime session and a Keras
model are served through `monitor.served` too, a wrapper returning exactly the outputs the model returns.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas import InputFileError
from schemas.monitoring import statistics_digest

from ...adapters import REGISTRY
from ...serving_taps import ServingTaps
from .sender import Sender, drift_url
from .window import Window

DEFAULT_SAMPLE_RATE = 0.1
DEFAULT_WINDOW_REQUESTS = 1000
DEFAULT_WINDOW_SECONDS = 60.0


@dataclass(frozen=True)
class MonitorStats:
    """Counters of one collector since it started."""

    requests: int
    sampled: int
    windows_closed: int
    windows_sent: int
    dropped: int
    rejected: int
    errors: int
    last_error: str | None
    last_state: str | None


def _adapter_of(model: Any):
    # An onnxruntime session is no onnx.ModelProto, but the ONNX adapter is the one that knows how to tap it.
    if type(model).__module__.startswith("onnxruntime"):
        return REGISTRY.model_adapter("onnx")
    return REGISTRY.model_adapter_of(model)


class Monitor:
    """A running collector (the TapSink the served object reports to); see the module docstring."""

    def __init__(self, model: Any, *, server: str | None, token: str | None, ref: str | None, sample_rate: float,
                 window_requests: int, window_seconds: float, max_pending: int = 8, timeout: float = 5.0, seed: int | None = None,
                 replica: str | None = None):
        if not 0.0 <= sample_rate <= 1.0:
            raise InputFileError(f"sample_rate={sample_rate} is not a fraction; pass a value between 0 and 1, e.g. 0.1.")
        if window_requests < 1 or window_seconds <= 0:
            raise InputFileError("window_requests must be at least 1 and window_seconds above 0; e.g. window_requests=1000, window_seconds=60.")
        if server is not None and ref is None:
            raise InputFileError("monitor(..., server=URL) needs ref='NAME@N', the registered version being served.")
        url = drift_url(server, ref) if server else None  # a bad ref is refused before the model is touched
        self.ref, self.sample_rate = ref, float(sample_rate)
        self.window_requests, self.window_seconds = int(window_requests), float(window_seconds)
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}"
        self._random = random.Random(seed)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._requests = self._sampled = self._closed = self._errors = 0
        self._last_error: str | None = None
        self.closed_windows: deque[dict] = deque(maxlen=64)  # the newest closed windows, also without a server
        self._taps: ServingTaps = _adapter_of(model).serving_taps(model, self)
        self.layers = [layer.name for layer in self._taps.layers]
        self.statistics_digest = statistics_digest((layer.running_mean, layer.running_var) for layer in self._taps.layers)
        self._window = Window(len(self.layers))
        self._sender = Sender(url, token, max_pending=max_pending, timeout=timeout) if url else None
        self._stopped = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="normbridge-monitor-window", daemon=True)
        self._ticker.start()

    # -- what the served object calls (the request path) --------------------------------------

    @property
    def served(self) -> Any:
        """The object to serve: the model itself for an nn.Module, else its instrumented form."""
        return self._taps.served

    def __call__(self, *args, **kwargs):
        return self._taps.served(*args, **kwargs)

    def begin(self) -> bool:
        sampled = self.sample_rate > 0 and self._random.random() < self.sample_rate
        self._local.sampled = sampled
        return sampled

    def sampling(self) -> bool:
        return getattr(self._local, "sampled", False)

    def observe(self, index: int, count: int, mean: np.ndarray, var: np.ndarray) -> None:
        try:
            with self._lock:
                self._window.moments[index].merge(count, mean, var)
        except Exception as error:
            self.failed(error)

    def failed(self, error: BaseException) -> None:
        with self._lock:
            self._errors += 1
            self._last_error = f"{type(error).__name__}: {error}"[:300]

    def end(self) -> None:
        sampled = getattr(self._local, "sampled", False)
        self._local.sampled = False
        closing = None
        with self._lock:
            self._requests += 1
            self._window.requests += 1
            self._window.sampled += int(sampled)
            if self._window.requests >= self.window_requests:
                closing = self._swap()
        if closing is not None:
            self._ship(closing)

    # -- windows ---------------------------------------------------------------------------

    def _swap(self) -> Window:
        """The open window, replaced by a fresh one (caller holds the lock)."""
        closing, self._window = self._window, Window(len(self.layers))
        self._sampled += closing.sampled
        return closing

    def _ship(self, window: Window) -> None:
        if window.sampled == 0 or not any(m.count for m in window.moments):
            return  # nothing observed: an empty window says nothing
        with self._lock:
            self._closed += 1
        dropped = self._sender.stats.dropped if self._sender else 0
        body = window.payload(self.layers, self.replica, dropped, self.statistics_digest)
        self.closed_windows.append(body)
        if self._sender is not None:
            self._sender.submit(body)

    def _tick(self) -> None:
        while not self._stopped.wait(min(self.window_seconds / 4, 0.5)):
            with self._lock:
                age = time.time() - self._window.started_at.timestamp()
                closing = self._swap() if age >= self.window_seconds and self._window.requests else None
            if closing is not None:
                self._ship(closing)

    def flush(self, timeout: float = 10.0) -> bool:
        """Close the open window and wait until every pending window was sent or dropped; False if `timeout` passed first."""
        with self._lock:
            closing = self._swap()
        self._ship(closing)
        return self._sender.wait(timeout) if self._sender else True

    def stats(self) -> MonitorStats:
        with self._lock:
            requests, sampled, closed, errors, last_error = self._requests, self._sampled + self._window.sampled, self._closed, self._errors, self._last_error
        sender = self._sender.stats if self._sender else None
        return MonitorStats(requests=requests, sampled=sampled, windows_closed=closed, windows_sent=sender.sent if sender else 0,
                            dropped=sender.dropped if sender else 0, rejected=sender.rejected if sender else 0, errors=errors,
                            last_error=(sender.last_error if sender and sender.last_error else last_error),
                            last_state=sender.last_state if sender else None)

    def close(self, timeout: float = 10.0) -> None:
        """Flush, stop the threads and take the taps off the model."""
        self.flush(timeout)
        self._stopped.set()
        self._ticker.join(timeout)
        if self._sender is not None:
            self._sender.close(timeout)
        self._taps.remove()

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def monitor(model: Any, server: str | None = None, token: str | None = None, ref: str | None = None, sample_rate: float = DEFAULT_SAMPLE_RATE,
            window_requests: int = DEFAULT_WINDOW_REQUESTS, window_seconds: float = DEFAULT_WINDOW_SECONDS, **options) -> Monitor:
    """Watch the BatchNorm inputs of a served model and ship statistics windows to a registry.

    Args:
        model: a torch.nn.Module (hooked in place: keep calling it), a torch ExportedProgram, an onnxruntime
            InferenceSession or a Keras model (serve `monitor.served`, or call the monitor itself).
        server: the registry's base URL (`normbridge serve`); None keeps closed windows in `closed_windows` only.
        token: a bearer token with role write on the model (`normbridge token create --role write --model NAME`).
        ref: the registered version being served, 'NAME@N'.
        sample_rate: fraction of requests whose layer inputs are pooled.
        window_requests, window_seconds: a window closes after this many requests or this many seconds.
        options: max_pending (queued windows, default 8), timeout (seconds per POST, 5), seed, replica.

    Example:
        >>> watch = monitor(model, server="http://127.0.0.1:8000", token=TOKEN, ref="cnn@3")
        >>> y = model(x)          # serve as before
        >>> watch.flush()         # send the open window now
    """
    return Monitor(model, server=server, token=token, ref=ref, sample_rate=sample_rate, window_requests=window_requests,
                   window_seconds=window_seconds, **options)


__all__ = ["Monitor", "MonitorStats", "monitor"]
