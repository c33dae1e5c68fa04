"""The serving collector: `monitor(model, server=..., token=..., ref="NAME@N")` watches a served model's BatchNorm
inputs.

A fraction `sample_rate` of requests is sampled; each BatchNorm input's per-channel statistics are merged into the
open window (window.py) for a fraction `sample_rate` of requests too. Where the taps see one layer at a time (torch
hooks and program taps: `ServingTaps.per_layer`), that fraction is drawn per layer and per request, independently:
each layer still sees a tenth of the traffic at 0.1, but a request pays for about a tenth of the layers instead of
one request in ten paying for all of them, which is what put the sampled requests (and so the p99) about 7% above the
rest. Taps that run the whole model again to see its layers (onnxruntime, Keras) observe every layer of the sampled
requests. The sampled requests (the request-level draw) are what `keep_sample` copies and `stats().sampled` counts. A
window closes every `window_requests` requests or `window_seconds` seconds, whichever comes first, and is queued for
the background sender (sender.py), which posts it to the registry. Nothing here blocks or fails a request: the taps
catch their own errors (counted in `stats().errors`), a full queue or an unreachable registry drops the window
(counted in `stats().dropped`), and the request path only takes a short lock.

The request thread does as little as it can: a request that observes nothing costs its random draws, a thread-local
read per hook and a counter under the lock. One that observes layers collects each observed layer's raw reductions in
a thread-local list and, at its end, hands the list (with a copy of its inputs when `keep_sample` is set) to the
collector's worker thread, which does the float64 Chan merges, keeps the traffic sample (sample.py) and closes
windows on time. The hand-over and the window-closing markers are queued under the same lock as the request count, so
every request's observations are merged into the window that counted it, before that window is shipped.

Each closed window also carries the serving faults seen at its close (schemas.monitoring.ServingFault): the taps' own
(a torch BatchNorm in train mode, a served graph computing batch statistics) and every layer whose running statistics
changed since the previous window (since the collector started, for the first), read again at each close; the window
then carries the digest of the statistics held at its close, which the registry compares with the version's
(statistics_mismatch). The first window that sees a fault carries it, and `stats().faults` says it.

The model adapter instruments the model (ModelAdapter.serving_taps): a torch nn.Module keeps serving itself with hooks
(the GraphModule of `ep.module()` with taps in its own graph); an ExportedProgram is served as `monitor.served` (its
module with taps); an onnxruntime session and a Keras model are served through `monitor.served` too, a wrapper returning
exactly the outputs the model returns.
"""

from __future__ import annotations

import os
import queue
import random
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schemas import InputFileError, UnsupportedObjectError
from schemas.monitoring import MAX_FAULTS, ServingFault, statistics_digest

from ...adapters import REGISTRY
from ...serving_taps import ServingTaps
from .sample import TrafficSample, copied_inputs
from .sender import Sender, drift_url
from .window import Window

DEFAULT_SAMPLE_RATE = 0.1
DEFAULT_WINDOW_REQUESTS = 1000
DEFAULT_WINDOW_SECONDS = 60.0
DEFAULT_MAX_BACKLOG = (
    256  # sampled requests waiting for the worker; beyond it their statistics are discarded and counted
)

_CLOSE, _STOP = object(), object()  # markers on the worker's queue
_CHANGED = (
    "the running statistics changed since the previous window: something updates them while serving "
    "(train mode, a training loop)"
)


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
    discarded: int = 0  # requests whose observations the worker was too far behind to take (max_backlog)
    kept_rows: int = 0  # input rows in the traffic sample (keep_sample)
    #: The serving faults of the newest closed window, and those the registry found in the newest window it stored
    #: (statistics_mismatch); empty when the model is served as registered. last_state is then 'serving_fault'.
    faults: tuple[ServingFault, ...] = ()


def _adapter_of(model: Any):
    # An onnxruntime session is no onnx.ModelProto, but the ONNX adapter is the one that knows how to tap it.
    if type(model).__module__.startswith("onnxruntime"):
        return REGISTRY.model_adapter("onnx")
    return REGISTRY.model_adapter_of(model)


class Monitor:
    """A running collector (the TapSink the served object reports to); see the module docstring."""

    def __init__(
        self,
        model: Any,
        *,
        server: str | None,
        token: str | None,
        ref: str | None,
        sample_rate: float,
        window_requests: int,
        window_seconds: float,
        keep_sample: int = 0,
        max_pending: int = 8,
        timeout: float = 5.0,
        seed: int | None = None,
        replica: str | None = None,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
    ):
        if not 0.0 <= sample_rate <= 1.0:
            raise InputFileError(
                f"sample_rate={sample_rate} is not a fraction; pass a value between 0 and 1, e.g. 0.1."
            )
        if window_requests < 1 or window_seconds <= 0:
            raise InputFileError(
                "window_requests must be at least 1 and window_seconds above 0; e.g. window_requests=1000, window_seconds=60."
            )
        if keep_sample < 0:
            raise InputFileError(
                f"keep_sample={keep_sample} is negative; pass 0 (keep no sample) or the number of input rows to keep."
            )
        if server is not None and ref is None:
            raise InputFileError("monitor(..., server=URL) needs ref='NAME@N', the registered version being served.")
        url = drift_url(server, ref) if server else None  # a bad ref is refused before the model is touched
        self.ref, self.sample_rate = ref, float(sample_rate)
        self.window_requests, self.window_seconds = int(window_requests), float(window_seconds)
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}"
        self._random = random.Random(seed)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._requests = self._closed = self._errors = self._discarded = self._backlog = self._drawn = 0
        self._max_backlog = max(1, int(max_backlog))
        self._last_error: str | None = None
        self.closed_windows: deque[dict] = deque(maxlen=64)  # the newest closed windows, also without a server
        self._taps: ServingTaps = _adapter_of(model).serving_taps(model, self)
        if keep_sample and self._taps.keep_refusal:
            self._taps.remove()
            raise UnsupportedObjectError(f"monitor(..., keep_sample={keep_sample}): {self._taps.keep_refusal}")
        self.layers = [layer.name for layer in self._taps.layers]
        self._every_layer = [True] * len(self.layers)  # the mask of a sampled request where layers are not drawn apart
        self._per_layer = self._taps.per_layer and 0.0 < self.sample_rate < 1.0
        self._statistics = [(layer.running_mean, layer.running_var) for layer in self._taps.layers]
        self.statistics_digest = statistics_digest(self._statistics)
        self._faults: tuple[ServingFault, ...] = ()
        self.sample = TrafficSample(keep_sample, self._taps.input_names) if keep_sample else None
        self._window = Window(len(self.layers))
        self._sender = Sender(url, token, max_pending=max_pending, timeout=timeout) if url else None
        self._work: queue.Queue = queue.Queue()  # (window, request's observations) and (window, _CLOSE), in lock order
        self._worker = threading.Thread(target=self._run, name="normbridge-monitor-worker", daemon=True)
        self._worker.start()

    # -- what the served object calls (the request path) --------------------------------------

    @property
    def served(self) -> Any:
        """The object to serve: the model itself for an nn.Module, else its instrumented form."""
        return self._taps.served

    def __call__(self, *args, **kwargs):
        return self._taps.served(*args, **kwargs)

    def begin(self) -> bool:
        rate, draw = self.sample_rate, self._random.random
        sampled = rate > 0 and draw() < rate
        if self._per_layer:
            mask = [draw() < rate for _ in self._every_layer]
            mask = mask if True in mask else None
        else:
            mask = self._every_layer if sampled else None
        local = self._local
        local.sampled, local.mask, local.pending, local.kept = sampled, mask, ([] if mask is not None else None), None
        return sampled

    def sampling(self) -> bool:
        return getattr(self._local, "sampled", False)

    def observing(self, index: int) -> bool:
        mask = getattr(self._local, "mask", None)
        return mask is not None and mask[index]

    def keep(self, inputs: Any, names: Any = None) -> None:
        if self.sample is None or not getattr(self._local, "sampled", False):
            return
        try:
            self._local.kept = (copied_inputs(inputs), tuple(names) if names is not None else None)
        except Exception as error:
            self.failed(error)

    def observe(self, index: int, count: int, mean: Any, var: Any) -> None:
        pending = getattr(self._local, "pending", None)
        if pending is not None:
            pending.append((index, count, mean, var, False))

    def observe_sums(self, index: int, count: int, sums: Any, squares: Any) -> None:
        pending = getattr(self._local, "pending", None)
        if pending is not None:
            pending.append((index, count, sums, squares, True))

    def failed(self, error: BaseException) -> None:
        with self._lock:
            self._errors += 1
            self._last_error = f"{type(error).__name__}: {error}"[:300]

    def end(self) -> None:
        local = self._local
        sampled = getattr(local, "sampled", False)
        pending, kept = getattr(local, "pending", None), getattr(local, "kept", None)
        observed = (pending or [], kept) if pending or kept is not None or sampled else None
        local.sampled, local.mask, local.pending, local.kept = False, None, None, None
        with self._lock:
            self._requests += 1
            window = self._window
            window.requests += 1
            if observed is not None:
                if self._backlog < self._max_backlog:
                    self._backlog += 1
                    window.sampled += (
                        sampled  # a window's `sampled` counts the sampled requests whose statistics it holds
                    )
                    self._work.put((window, observed))
                else:
                    self._discarded += 1
            self._drawn += sampled
            if window.requests >= self.window_requests:
                self._close_locked()

    # -- the worker thread: merges, the traffic sample, windows ----------------------------------

    def _close_locked(self) -> None:
        """Swap in a fresh window and queue the old one to be shipped after its pending merges
        (caller holds the lock)."""
        closing, self._window = self._window, Window(len(self.layers))
        self._work.put((closing, _CLOSE))

    def _merge(self, window: Window, observed: tuple) -> None:
        pending, kept = observed
        with self._lock:
            self._backlog -= 1
        for index, count, first, second, sums in pending:
            try:
                moments = window.moments[index]
                if sums:
                    moments.merge_sums(count, first, second)
                else:
                    moments.merge(count, first, second)
            except Exception as error:
                self.failed(error)
        if kept is not None:
            try:
                self.sample.add(*kept)
            except Exception as error:
                self.failed(error)

    def _ship(self, window: Window) -> None:
        if window.sampled == 0 or not any(m.count for m in window.moments):
            return  # nothing observed: an empty window says nothing
        with self._lock:
            self._closed += 1
        faults = self._serving_faults()
        dropped = self._sender.stats.dropped if self._sender else 0
        body = window.payload(
            self.layers,
            self.replica,
            dropped,
            self.statistics_digest,
            [fault.model_dump(exclude_none=True) for fault in faults],
        )
        self.closed_windows.append(body)
        if self._sender is not None:
            self._sender.submit(body)

    def _serving_faults(self) -> tuple[ServingFault, ...]:
        """What the served object computes with batch statistics now, and the layers whose statistics changed since the
        previous window (whose digest then replaces `statistics_digest`); at most MAX_FAULTS, first ones kept."""
        try:
            found = [ServingFault(kind=kind, layer=layer, detail=detail) for kind, layer, detail in self._taps.faults()]
        except Exception as error:  # a tap that cannot say must not stop the window
            self.failed(error)
            found = []
        live = None
        if self._taps.statistics is not None:
            try:
                live = self._taps.statistics()
            except Exception as error:
                self.failed(error)
        if live is not None:
            for name, (mean, var), (was_mean, was_var) in zip(self.layers, live, self._statistics):
                if not (np.array_equal(mean, was_mean) and np.array_equal(var, was_var)):
                    found.append(ServingFault(kind="statistics_changed", layer=name, detail=_CHANGED))
            self._statistics = live
            self.statistics_digest = statistics_digest(live)
        self._faults = tuple(found[:MAX_FAULTS])
        return self._faults

    def _run(self) -> None:
        tick = min(self.window_seconds / 4, 0.5)
        while True:
            try:
                window, what = self._work.get(timeout=tick)
            except queue.Empty:
                window = what = None
            if what is not None:
                try:
                    if what is _STOP:
                        return
                    if what is _CLOSE:
                        self._ship(window)
                    else:
                        self._merge(window, what)
                except Exception as error:  # never let the worker die
                    self.failed(error)
                finally:
                    self._work.task_done()
            with self._lock:
                if self._window.requests and time.time() - self._window.started_at.timestamp() >= self.window_seconds:
                    self._close_locked()

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until the worker has merged every request answered so far; False if `timeout` passed first."""
        deadline = time.monotonic() + timeout
        while self._work.unfinished_tasks:
            if time.monotonic() > deadline or not self._worker.is_alive():
                return False
            time.sleep(0.002)
        return True

    def flush(self, timeout: float = 10.0) -> bool:
        """Close the open window and wait until every pending window was sent or dropped;
        False if `timeout` passed first."""
        with self._lock:
            self._close_locked()
        settled = self.settle(timeout)
        return (self._sender.wait(timeout) if self._sender else True) and settled

    def save_sample(self, path: str | Path) -> int:
        """Write the kept traffic sample as an .npz for `normbridge recalibrate` (sample.py);
        returns the rows written."""
        if self.sample is None:
            raise InputFileError(
                "this collector keeps no traffic sample; start it with monitor(..., keep_sample=N) to keep the last N input rows."
            )
        self.settle()
        return self.sample.save(path)

    def stats(self) -> MonitorStats:
        """The counters, once the requests answered so far are merged (waits for the worker, at most a second)."""
        self.settle(1.0)
        with self._lock:
            discarded = self._discarded
            requests, sampled, closed, errors, last_error = (
                self._requests,
                self._drawn,
                self._closed,
                self._errors,
                self._last_error,
            )
        sender = self._sender.stats if self._sender else None
        return MonitorStats(
            requests=requests,
            sampled=sampled,
            windows_closed=closed,
            windows_sent=sender.sent if sender else 0,
            dropped=sender.dropped if sender else 0,
            rejected=sender.rejected if sender else 0,
            errors=errors,
            last_error=(sender.last_error if sender and sender.last_error else last_error),
            last_state=sender.last_state if sender else None,
            discarded=discarded,
            kept_rows=self.sample.rows if self.sample else 0,
            faults=_merged(self._faults, sender.last_faults if sender else ()),
        )

    def close(self, timeout: float = 10.0) -> None:
        """Flush, stop the threads and take the taps off the model."""
        self.flush(timeout)
        self._work.put((None, _STOP))
        self._worker.join(timeout)
        if self._sender is not None:
            self._sender.close(timeout)
        self._taps.remove()

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _merged(*groups) -> tuple[ServingFault, ...]:
    """The faults of every group, each (kind, layer) once, in order."""
    seen: dict[tuple, ServingFault] = {}
    for group in groups:
        for fault in group:
            seen.setdefault((fault.kind, fault.layer), fault)
    return tuple(seen.values())


def monitor(
    model: Any,
    server: str | None = None,
    token: str | None = None,
    ref: str | None = None,
    sample_rate: float = DEFAULT_SAMPLE_RATE,
    window_requests: int = DEFAULT_WINDOW_REQUESTS,
    window_seconds: float = DEFAULT_WINDOW_SECONDS,
    keep_sample: int = 0,
    **options,
) -> Monitor:
    """Watch the BatchNorm inputs of a served model and ship statistics windows to a registry.

    Args:
        model: a torch.nn.Module (hooked in place: keep calling it; an ExportedProgram's `module()` too, its graph's
            batch-norm calls tapped in place), a torch ExportedProgram, an onnxruntime InferenceSession or a Keras model
            (serve `monitor.served`, or call the monitor itself).
        server: the registry's base URL (`normbridge serve`); None keeps closed windows in `closed_windows` only.
        token: a bearer token with role write on the model (`normbridge token create --role write --model NAME`).
        ref: the registered version being served, 'NAME@N'.
        sample_rate: fraction of requests whose layer inputs are pooled; for torch drawn per layer (each layer sees
            that share of the traffic, a request pays for about that share of its layers).
        window_requests, window_seconds: a window closes after this many requests or this many seconds.
        keep_sample: keep the last this many input rows of sampled requests (copied; 0 keeps none), for
            `monitor.save_sample("traffic.npz")` and then `normbridge recalibrate MODEL traffic.npz`. Inputs passed by
            keyword (`model(pixel_values=x)`) are kept under their names like positional ones; a model whose inputs
            cannot be kept as arrays is refused here, not on each request.
        options: max_pending (queued windows, default 8), timeout (seconds per POST, 5), seed, replica, max_backlog
            (sampled requests waiting for the worker thread, default 256; beyond it they are discarded and counted).

    Example:
        >>> watch = monitor(model, server="http://127.0.0.1:8000", token=TOKEN, ref="cnn@3")
        >>> y = model(x)          # serve as before
        >>> watch.flush()         # send the open window now
    """
    return Monitor(
        model,
        server=server,
        token=token,
        ref=ref,
        sample_rate=sample_rate,
        window_requests=window_requests,
        window_seconds=window_seconds,
        keep_sample=keep_sample,
        **options,
    )


__all__ = ["Monitor", "MonitorStats", "monitor"]
