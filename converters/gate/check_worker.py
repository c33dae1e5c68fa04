"""A worker process that runs `check` on the frameworks it is asked for, so the caller need not import them.

Why: a registration of a .pt2 checks every normalizer on Keras too, and importing TensorFlow costs
about 4-7 s of CPU, more than reading the model. The worker runs `converters.check` on the same spec, keeping
the objects it built for later specs of the same configuration (grouped_check.checker_for: the results are check's,
field for field): the spec travels as its JSON document and safetensors bytes (schemas/spec_io.py, bit-exact, nothing
executed on reading), the result comes back as the CheckResult's fields in JSON (infinities included), an error as its
NormbridgeError class, message, layer and setting. A check request may ask the worker to leave the round trips back to
a source framework it has not imported to the caller (`defer_round_trips`; converters/gate/round_trips.py). A worker is
either the caller's own child on pipes (worker_client.start_child) or the shared one on a Unix socket that outlives its
callers (converters/gate/shared_worker.py); both speak this, and converters/gate/worker_client.py is the caller's side.

Frames are an 8-byte big-endian length and that many bytes: a request is two frames (header JSON,
tensor bytes), a reply one. A header is a check ({"frameworks", "spec"}), or the checks of several specs at once
({"frameworks", "specs", "sizes"}: the tensor frame is each spec's safetensors bytes one after another, `sizes` long;
answered by {"results": [...]} from `check_many`, each object built once per configuration), or {"warm": [names]}
(import those frameworks now), or {"prepare": [names]} (answered at once, then those frameworks imported with
what reading their models imports, and a shared worker's jobs module's `prepare`), or {"shutdown": true} (shared
worker only), or {"job": NAME, "args": {...}} (shared worker only: one of the jobs the worker was started with,
`serve(jobs=...)`; answered by zero or more
{"progress": [...]} frames, then {"done": ...} or {"error": ...}; a caller that hangs up stops the job at its next
progress frame). Requests are answered in order. `python -m converters.gate.check_worker PACKAGES torch keras` builds
the caller's AdapterRegistry from PACKAGES (JSON), imports the named frameworks at once, then serves its stdin
until it closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from schemas import CheckResult, NormSpec, NormbridgeError
from schemas import errors as error_types
from schemas.spec_io import spec_from_parts

from .. import lean_imports
from . import round_trips
from ..heap import settle_heap, settled_after_imports
from ..adapters import AdapterRegistry, imported
from .grouped_check import check_many, checker_for

_LENGTH = struct.Struct(">Q")
#: The folder holding the `converters` package, put first on the worker's path (it runs this copy of normbridge).
ROOT = str(Path(__file__).resolve().parents[2])
#: Largest frame a worker reads: a header is a spec's JSON, the tensors one normalizer's state (a vocabulary-sized
#: LayerNorm is a few MB); anything larger is not a request of this protocol.
MAX_FRAME = 1 << 30


class ProtocolError(Exception):
    """A frame this protocol never sends (too long): the connection is dropped."""


def write_frame(stream: BinaryIO, payload: bytes) -> None:
    stream.write(_LENGTH.pack(len(payload)))
    stream.write(payload)


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(stream: BinaryIO, limit: int = MAX_FRAME) -> bytes | None:
    """The next frame, None at the end of the stream. Raises ProtocolError for a frame longer than `limit`."""
    head = _read_exactly(stream, _LENGTH.size)
    if head is None:
        return None
    size = _LENGTH.unpack(head)[0]
    if size > limit:
        raise ProtocolError(f"a frame of {size} bytes, more than the {limit} a check worker reads")
    return _read_exactly(stream, size)


def error_from(fields: dict) -> Exception:
    """The worker's error as the caller would have seen it in process: its NormbridgeError class when it had one."""
    classes = {
        cls.code: cls
        for cls in vars(error_types).values()
        if isinstance(cls, type) and issubclass(cls, NormbridgeError)
    }
    cls = classes.get(fields.get("code"))
    if cls is None:
        return RuntimeError(f"the check's worker process failed: {fields['type']}: {fields['message']}")
    error = cls.__new__(cls)
    Exception.__init__(error, fields["message"])
    error.message, error.layer, error.setting = fields["message"], fields.get("layer"), fields.get("setting")
    return error


def warm_up(registry: AdapterRegistry, frameworks: list[str]) -> CheckResult | None:
    """Import `frameworks`, then check one small BatchNorm of normbridge's own through them, before any caller asks.

    Why: a process's first check traces the frameworks' functions and opens their first sessions: 0.4 s with Keras on
    TensorFlow and onnxruntime, against about 14 ms for each later spec of any configuration. A worker started while its
    caller reads the model has that time free. The sample is not a caller's data and its result is not kept; the objects
    built for it are kept like any configuration's (converters/gate/kept_objects.py), and no result depends on them. A
    sample that fails to check costs only its time: the callers' own checks say what is wrong. Returns the sample's
    result (None when it raised), for the tests."""
    registry.import_frameworks(frameworks)
    if not frameworks:
        return
    state = {
        "scale": [1.5, 0.5, 1.0, 2.0],
        "bias": [0.1, -0.2, 0.0, 0.3],
        "running_mean": [0.5, -1.0, 0.25, 2.0],
        "running_var": [1.0, 0.5, 2.0, 0.25],
    }
    try:
        sample = NormSpec(
            name="worker warm-up",
            kind="batch",
            eps=1e-5,
            dtype="float32",
            source={"framework": frameworks[-1]},
            num_features=4,
            spatial_rank=2,
            layout="channels_first",
            momentum=0.1,
            momentum_convention="batch_weight",
            track_running_stats=True,
            variance_estimator="unbiased",
            scale=True,
            bias=True,
            tensors={key: np.asarray(values, dtype=np.float32) for key, values in state.items()},
        )
        return check_many([sample], frameworks=list(frameworks), registry=registry)[0]
    except Exception:  # noqa: BLE001  see the docstring: nothing is skipped for a caller
        pass


#: A job a shared worker runs for its callers: (arguments from the request, a function that sends a progress frame) ->
#: result.
Job = Callable[[dict, Callable[[list], None]], dict]


def error_fields(error: BaseException) -> dict:
    """An error as the fields `error_from` turns back into it on the caller's side."""
    return {
        "type": type(error).__name__,
        "message": str(error),
        "code": getattr(error, "code", None),
        "layer": getattr(error, "layer", None),
        "setting": getattr(error, "setting", None),
    }


def _run_job(request: dict, jobs: dict[str, Job], progress: Callable[[list], None]) -> dict:
    job = jobs.get(request.get("job"))
    if job is None:
        return {
            "error": {
                "type": "ProtocolError",
                "message": f"this worker runs no job named {request.get('job')!r}",
                "code": None,
            }
        }
    try:
        return {"done": job(request.get("args") or {}, progress)}
    except Exception as error:  # every error goes back to the caller, as `answer`'s do
        return {"error": error_fields(error)}


def _specs_from_parts(documents: list, sizes: list, tensors: bytes) -> list[NormSpec]:
    """The specs of a many-spec request: `tensors` cut at `sizes`, which must cover it exactly."""
    if (
        not isinstance(documents, list)
        or not isinstance(sizes, list)
        or len(documents) != len(sizes)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes)
        or sum(sizes) != len(tensors)
    ):
        raise ProtocolError(f"a request of {len(tensors)} tensor bytes whose sizes do not cover them")
    specs, start = [], 0
    for document, size in zip(documents, sizes):
        specs.append(spec_from_parts(document, tensors[start : start + size]))
        start += size
    return specs


def answer(header: bytes, tensors: bytes, registry: AdapterRegistry) -> dict:
    """The reply to one request: a check's result, or its error as fields (every error goes back to the caller)."""
    try:
        request = json.loads(header)
        if "warm" in request:
            registry.import_frameworks(request["warm"])
            return {"warmed": request["warm"]}
        many = "specs" in request
        specs = (
            _specs_from_parts(request["specs"], request["sizes"], tensors)
            if many
            else [spec_from_parts(request["spec"], tensors)]
        )
        # The caller runs the round trips back to a source framework this worker has not imported (it read the model):
        # importing it here would cost more than they do. One this worker has is cheaper here,
        # beside the caller's own legs.
        asked = bool(request.get("defer_round_trips"))
        defer = asked and not all(imported(spec.source.framework) for spec in specs)
        with round_trips.deferring() if defer else contextlib.nullcontext() as held:
            if many:
                results = check_many(specs, frameworks=request["frameworks"], registry=registry)
            else:
                results = [checker_for(registry).check(specs[0], frameworks=request["frameworks"])]
        fields = [result.model_dump(mode="python") for result in results]
        reply = {"results": fields} if many else {"result": fields[0]}
        # each result's round trips left to the caller, none where this worker ran them (converters/gate/round_trips.py)
        if asked:
            trips = [[trip.fields() for trip in held.of(result)] if held is not None else [] for result in results]
            reply["round_trips"] = trips if many else trips[0]
        return reply
    except Exception as error:
        return {"error": error_fields(error)}


def serve(
    requests: BinaryIO,
    replies: BinaryIO,
    registry: AdapterRegistry,
    lock: threading.Lock | None = None,
    on_shutdown: Callable[[], None] | None = None,
    jobs: dict[str, Job] | None = None,
    on_prepare: Callable[[list[str]], None] | None = None,
) -> None:
    """Answer requests until the stream ends; `lock` is held around each answer (a shared worker serves several callers
    from threads, and the frameworks' objects are built one at a time). A prepare request is answered at once, then its
    frameworks imported and `on_prepare` run (the jobs module's preparation for their models). Raises ProtocolError for
    a frame too long."""
    lock = lock or threading.Lock()
    progress = _Progress(replies)

    while (header := read_frame(requests)) is not None:
        tensors = read_frame(requests)
        if tensors is None:
            return
        if on_shutdown is not None and header.startswith(b'{"shutdown"') and json.loads(header) == {"shutdown": True}:
            write_frame(replies, b'{"stopped": true}')
            replies.flush()
            on_shutdown()
            return
        if header.startswith(b'{"prepare"'):
            names = _prepared(json.loads(header), registry.framework_names)
            write_frame(replies, json.dumps({"prepared": names}).encode())
            replies.flush()
            with lock:  # nobody waits for it: off every caller's clock but the next request's
                _prepare(registry, names, on_prepare)
            continue
        job = bool(jobs) and header.startswith(b'{"job"')
        with lock:
            reply = _run_job(json.loads(header), jobs, progress) if job else answer(header, tensors, registry)
        write_frame(replies, json.dumps(reply).encode())
        replies.flush()
        if job:
            with lock:  # after the answer, off the caller's clock
                settle_heap()


#: Seconds between a job's progress frames, at least, except a step's first and last
#: (a CLI redraws about ten times a second).
PROGRESS_INTERVAL = 0.05


class _Progress:
    """Sends a job's progress frames: every step's first (done 0) and last (done == total), the others at most every
    PROGRESS_INTERVAL (a frame that is not [step, done, total] always). Why: a registration reports each normalizer it
    checks and each blob it stores (274 frames for a 53-BatchNorm model), and the caller only redraws a bar. A caller
    that hung up is still found at the next frame sent: at the latest the commit's own step,
    before anything is committed."""

    def __init__(self, replies: BinaryIO):
        self.replies, self.sent = replies, float("-inf")

    def __call__(self, fields: list) -> None:
        now = time.monotonic()
        counted = len(fields) == 3 and all(type(value) is int for value in fields[1:])
        if not counted or fields[1] == 0 or fields[1] >= fields[2] or now - self.sent >= PROGRESS_INTERVAL:
            write_frame(self.replies, json.dumps({"progress": fields}).encode())
            self.replies.flush()
            self.sent = now


def _prepared(request: dict, known: list[str]) -> list[str]:
    """The frameworks a prepare request names, those of this worker's registry only (anything else is ignored)."""
    names = request.get("prepare")
    return [name for name in names if name in known] if isinstance(names, list) else []


def _prepare(registry: AdapterRegistry, names: list[str], on_prepare: Callable[[list[str]], None] | None) -> None:
    """Import `names` and what reading their models imports, ahead of the next job. A failure costs only its time: the
    job that needs them meets it again and reports it. The heap is settled only when something was imported: a worker
    that had it all (asked after every gate of a registration that runs in its caller) does nothing."""
    with settled_after_imports():
        try:
            registry.import_frameworks(names)
            for name in names:
                registry.model_adapter(name).prepare_loading()
            if on_prepare is not None:
                on_prepare(names)
        except Exception:  # noqa: BLE001  see the docstring
            pass


def main(argv: list[str]) -> None:
    """argv: the caller's adapter packages (JSON: AdapterRegistry.packages), then the frameworks to import at once."""
    lean_imports.enable()
    registry = AdapterRegistry(json.loads(argv[0]))
    warm_up(registry, argv[1:])  # imports the frameworks now, while the caller reads its model
    serve(sys.stdin.buffer, sys.stdout.buffer, registry)
    sys.stdout.flush()
    os._exit(0)  # TensorFlow's teardown takes seconds and nobody waits for it


if __name__ == "__main__":
    main(sys.argv[1:])
