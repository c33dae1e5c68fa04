"""`SplitCheck`: the gate's checks of one model's normalizers, each framework's leg run where it costs least.

A leg is the part of one layer's check that runs on some of its target frameworks, in one process: `check(spec,
frameworks=...)` on those frameworks alone. `check(spec)` converts a layer to every framework; a registration of a .pt2
would import TensorFlow for the Keras leg (4-7 s of CPU) and one of a .keras would import torch. Here a leg runs in
this process when its framework is imported here already or is the spec's own (reading the model imported it);
otherwise it runs in a worker process (converters/gate/check_worker.py), started as soon as the caller knows the
model's framework (`SplitCheck(model_framework)`), so its imports can overlap reading the model. The worker is private
(this process's child, kept for the next registration of a long-lived process; ONNX legs stay here, onnx imports in
under a second, less than a worker costs) unless `shared` names a shared worker (`SharedWorker`): then every leg not
imported here goes to the warm worker of that folder (converters/gate/shared_worker.py), which outlives this process and
serves the next CLI process warm. `merge_parts` (converters/gate/merging.py) puts the worker's entries where an
in-process check puts them: the results are the ones `check(spec)` gives, passed or failed
(tests/converters/gate/test_split_check.py compares them). A worker that has not imported the spec's own framework
leaves its legs' round trips back to it to this process, which has it (converters/gate/round_trips.py), so it never
imports it for them; a shared one imports it after answering, for the next registration it runs whole.

Spread legs (`spread`: a process that has every framework imported, such as a shared worker running whole
registrations for its callers) would run every leg in it, one after another on one core, while a machine has two. With
legs spread, the named legs (the Keras leg of a .pt2's normalizers, the torch leg of a .keras model's) run in a private
child kept warm beside it (`start_spread`), at the same time as its own legs: the gate takes about its longest leg per
normalizer instead of the sum. The child imports every spread framework, so the round trips back to the spec's own
framework run there too. A gate that finds the child still importing runs every leg here (it never waits for those
imports), and a child that dies before answering has its legs run here: they are never skipped.

How a caller chooses among these is converters/gate/gates.py (`Gate`); this module holds the pool of live workers
this process uses (private children, connections to shared workers, spread children), reused across gates.
"""

from __future__ import annotations

import atexit
import json
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import converters
from schemas import CheckResult, NormSpec, NormbridgeError

from ..adapters import MODEL_FILES, REGISTRY, imported
from ..equivalence import check
from . import kept_objects, shared_worker
from .group_objects import GroupObjects
from .merging import finish_round_trips, merge_parts
from .worker_client import WorkerConnection, WorkerGone, start_child

#: Frameworks whose legs run in process beside a private worker: onnx and onnxruntime import in under a second, less
#: than a worker costs. Beside a shared worker (already warm) they go there too.
IN_PROCESS = ("onnx",)

#: Tensor bytes of the specs sent to a worker in one request, at most (one spec larger than this goes alone).
BATCH_BYTES = 64 << 20

#: The live workers of this process, reused by later gates: a pool, not a setting (what goes where is SplitCheck's).
_WORKERS: dict[tuple[str, tuple[str, ...]], WorkerConnection] = {}
_WORKERS_LOCK = threading.Lock()
#: Each spread child's warm-up request, answered once its imports are done (the child itself is in _WORKERS).
_SPREAD_WARM: dict[WorkerConnection, Future] = {}


@dataclass(frozen=True)
class SharedWorker:
    """The shared worker a gate sends its legs to: its folder, the seconds it waits alone before it exits, and the jobs
    its callers register for it to run (shared_worker.JobSource; None: checks only)."""

    folder: Path
    idle: float = shared_worker.DEFAULT_IDLE_SECONDS
    jobs: shared_worker.JobSource | None = None


def expected_framework(model: Any) -> str | None:
    """The framework a model file or object belongs to, told without reading it (None: not known before reading)."""
    if isinstance(model, (str, Path)):
        if Path(model).is_dir():
            return REGISTRY.folder_framework(Path(model))
        return MODEL_FILES.get(Path(model).suffix.lower(), (None, None))[0]
    try:
        return REGISTRY.model_framework(model)
    except NormbridgeError:
        return None


def start_spread(spread: Sequence[str], packages: dict[str, str]) -> Future | None:
    """Start the spread child for `spread` and these adapter packages now, off the next gate's clock, if none lives; the
    future of its warm-up (answered once it is ready), None when `spread` is empty.

    Why: a process that runs whole registrations with every framework imported (a shared worker running
    builds its gate so) ran every leg in turn on one core; a .pt2's Keras leg in the child, beside its torch and ONNX
    legs here, takes the gate from about 3.3 ms per BatchNorm towards the longest of them. The cost is a second warm
    process: the child imports every framework in `spread` (TensorFlow and torch: about 0.8 GB resident), so that round
    trips back to either run there, and it is kept, as private workers are, until this process exits."""
    return _spread_child(packages, tuple(spread))[1] if spread else None


def _spread_child(packages: dict[str, str], spread: tuple[str, ...]) -> tuple[WorkerConnection, Future]:
    """The spread child for these packages and its warm-up's future, started if none lives (it imports `spread`)."""
    with _WORKERS_LOCK:
        worker = _private(packages, spread)
        if worker not in _SPREAD_WARM:
            for gone in [child for child in _SPREAD_WARM if not child.alive()]:
                del _SPREAD_WARM[gone]
            _SPREAD_WARM[worker] = worker.warm(list(spread))
        return worker, _SPREAD_WARM[worker]


def _spread_now(packages: dict[str, str], spread: tuple[str, ...], shared: SharedWorker | None) -> tuple[str, ...]:
    """The legs a gate starting now spreads: `spread` once its child has finished its imports, none before (the gate
    runs them here rather than wait for the child, which goes on importing for the next gate),
    none beside a shared worker."""
    if not spread or shared is not None:
        return ()
    worker, ready = _spread_child(packages, spread)
    return spread if ready.done() and ready.exception() is None and worker.alive() else ()


def _shared_key(packages: dict[str, str], shared: SharedWorker) -> tuple:
    return json.dumps(packages, sort_keys=True), (
        "shared",
        str(shared.folder),
        shared_worker.jobs_reference(shared.jobs),
    )


def _start(packages: dict[str, str], frameworks: tuple[str, ...], shared: SharedWorker | None) -> None:
    """Have the worker for `frameworks` start importing them, without waiting for it: the shared one is started if none
    runs (`_worker` connects when the gate needs it) or asked to import them; a private one starts as in `_worker`."""
    if shared is None:
        _worker(packages, frameworks, None)
        return
    with _WORKERS_LOCK:
        key = _shared_key(packages, shared)
        worker = _WORKERS.get(key)
        if worker is None or not worker.alive():
            try:
                worker = shared_worker.start(shared.folder, packages, list(frameworks), shared.idle, jobs=shared.jobs)
            except shared_worker.WorkerUnavailable:
                return  # `_worker` says why when the gate asks for it, and runs a private worker
            if worker is None:
                return  # started, importing `frameworks`
            _WORKERS[key] = worker
        worker.warm(list(frameworks))


def _shared(packages: dict[str, str], frameworks: tuple[str, ...], shared: SharedWorker) -> WorkerConnection | None:
    """A connection to the shared worker, asked to import `frameworks` now; None
    (with a warning) when none can be used."""
    key = _shared_key(packages, shared)
    worker = _WORKERS.get(key)
    if worker is None or not worker.alive():
        try:
            worker = _WORKERS[key] = shared_worker.connect(
                shared.folder, packages, list(frameworks), shared.idle, jobs=shared.jobs
            )
        except shared_worker.WorkerUnavailable as reason:
            warnings.warn(f"the gate's legs run in a private worker: {reason}", RuntimeWarning, stacklevel=3)
            return None
    worker.warm(list(frameworks))  # a worker started for another model's frameworks imports these now
    return worker


def _worker(packages: dict[str, str], frameworks: tuple[str, ...], shared: SharedWorker | None) -> WorkerConnection:
    """The live worker with these adapter packages, warmed with `frameworks`, started if there is none (reused by later
    registrations): the `shared` one when given and it can be used, else a private child."""
    with _WORKERS_LOCK:
        worker = _shared(packages, frameworks, shared) if shared is not None else None
        return worker if worker is not None else _private(packages, frameworks)


def _private(packages: dict[str, str], frameworks: tuple[str, ...]) -> WorkerConnection:
    """The live private worker (this process's child) for these packages and frameworks, started if there is none.
    Called with _WORKERS_LOCK held."""
    key = (json.dumps(packages, sort_keys=True), frameworks)
    worker = _WORKERS.get(key)
    if worker is None or not worker.alive():
        worker = _WORKERS[key] = start_child(list(frameworks), packages)
    return worker


@atexit.register
def _close_workers() -> None:
    """At exit, end the private workers and reap them (no orphan outlives the process); leave the shared one serving."""
    for worker in _WORKERS.values():
        worker.close()


class SplitCheck:
    """`check` for every spec of one model; legs of frameworks this process has not imported run in a worker."""

    def __init__(
        self,
        model_framework: str | None = None,
        registry=REGISTRY,
        in_worker: Sequence[str] | None = None,
        shared: SharedWorker | None = None,
        spread: Sequence[str] = (),
    ):
        """`model_framework`: the model's, when known before it is read (its worker starts importing now). `in_worker`
        names the legs to run in the worker whatever this process has imported (the tests compare both ways); `shared`:
        the shared worker to use instead of a private child; `spread`: the legs to spread
        (see the module's docstring)."""
        self._registry = registry
        self._order = registry.framework_names
        self._in_worker = None if in_worker is None else list(in_worker)
        self._shared, self._spread_names = shared, tuple(spread)
        self._workers: dict[str, WorkerConnection] = {}
        self._spread: tuple[str, ...] = ()  # decided when the gate starts (check_all): the child may be ready by then
        if model_framework is not None and self._remote_legs(model_framework):
            _start(
                registry.packages, self._warm(model_framework), shared
            )  # its imports overlap the caller's reading the model

    def _remote_legs(self, own: str) -> list[str]:
        if self._in_worker is not None:
            return [name for name in self._order if name in self._in_worker]
        here = () if self._shared is not None else IN_PROCESS
        return [
            name
            for name in self._order
            if name != own and (name in self._spread or (name not in here and not imported(name)))
        ]

    def _local_all(
        self, plans: list, progress: Callable[[int, NormSpec], None] | None
    ) -> list[CheckResult | None] | None:
        """Every spec's legs in this process, through `converters.check_many` (each object built once per configuration;
        the public entry point, looked up now: a caller may wrap it); None if it raises, so that each spec is then
        checked alone and the error raised is the first spec's, in order."""
        by_legs: dict[tuple[str, ...], list[int]] = {}
        for i, (_, remote) in enumerate(plans):
            legs = tuple(name for name in self._order if name not in remote)
            if legs:
                by_legs.setdefault(legs, []).append(i)
        results: list[CheckResult | None] = [None] * len(plans)
        try:
            for legs, indices in by_legs.items():
                told = None if progress is None else lambda j, spec, indices=indices: progress(indices[j], spec)
                checked = converters.check_many(
                    [plans[i][0] for i in indices], frameworks=list(legs), registry=self._registry, progress=told
                )
                for i, result in zip(indices, checked):
                    results[i] = result
        except Exception:  # noqa: BLE001  checked again spec by spec, which raises it in order
            return None
        return results

    def _worker_for(self, own: str) -> WorkerConnection:
        """The worker for specs from `own`, asked once per gate."""
        if own not in self._workers:
            self._workers[own] = _worker(self._registry.packages, self._warm(own), self._shared)
        return self._workers[own]

    def _warm(self, own: str) -> tuple[str, ...]:
        """The frameworks the worker imports for specs from `own`: its legs. Not `own`: the round trips back to it run
        here (converters/gate/round_trips.py), where reading the model imported it. With legs spread: the spread child's
        frameworks (it has them all, so round trips back to `own` run there too)."""
        legs = tuple(self._remote_legs(own))
        return tuple(dict.fromkeys(self._spread + legs)) if self._spread else legs

    def _prepare_next(self) -> None:
        """Have the shared worker import the models' own frameworks and their readers once it has answered this gate's
        legs (requests are answered in order): off this registration's clock, for the next one, which it runs whole
        (its callers' jobs)."""
        if self._shared is not None:
            for own, worker in self._workers.items():
                if own in self._order:
                    worker.prepare([own])

    def _remote_result(
        self, spec: NormSpec, remote: list[str], batch: "_Batch", position: int, objects: GroupObjects
    ) -> CheckResult:
        """The worker's answer, its round trips run here with `objects`; if a shared worker ended before answering
        (killed, out of memory), the same legs again in a private worker, and if the spread child ended, here:
        they are never skipped."""
        try:
            checked = batch.result(position)
        except WorkerGone:
            if self._spread:
                return check(spec, frameworks=remote, registry=self._registry)
            if self._shared is None:
                raise
            with _WORKERS_LOCK:
                worker = _private(self._registry.packages, tuple(remote))
            checked = worker.submit(spec, remote, defer_round_trips=True).result()
        return finish_round_trips(spec, checked, self._registry, objects)

    def _send_remote(self, plans: list) -> dict[int, tuple["_Batch", int]]:
        """Every spec's worker legs, sent at once: one request per source framework and legs (up to BATCH_BYTES of
        tensors each); index -> (its batch, its position there)."""
        groups: dict[tuple[str, tuple[str, ...]], list[list[int]]] = {}
        filled: dict[tuple[str, tuple[str, ...]], int] = {}  # tensor bytes of each group's last chunk
        for i, (spec, remote) in enumerate(plans):
            if remote:
                key, size = (spec.source.framework, tuple(remote)), _tensor_bytes(spec)
                chunks = groups.setdefault(key, [[]])
                if chunks[-1] and filled[key] + size > BATCH_BYTES:
                    chunks.append([])
                    filled[key] = 0
                chunks[-1].append(i)
                filled[key] = filled.get(key, 0) + size
        sent = {}
        for (own, remote), chunks in groups.items():
            for indices in chunks:
                batch = _Batch(self._worker_for(own), [plans[i][0] for i in indices], list(remote))
                sent.update({i: (batch, position) for position, i in enumerate(indices)})
        return sent

    def check_all(
        self, specs: Sequence[NormSpec], progress: Callable[[int, NormSpec], None] | None = None
    ) -> list[CheckResult]:
        """`check(spec)` of every spec, in order; the worker's legs are all sent first, so both processes work at once.
        Raises what `check` raises, for the first spec it raises on."""
        if self._in_worker is None:
            self._spread = _spread_now(self._registry.packages, self._spread_names, self._shared)
        plans = [(spec, self._remote_legs(spec.source.framework)) for spec in specs]
        sent = self._send_remote(plans)
        self._prepare_next()
        checked = self._local_all(plans, progress)
        results = []
        with kept_objects.lent(
            self._registry, GroupObjects
        ) as objects:  # the round trips' layers built as check_many builds them
            for i, (spec, remote) in enumerate(plans):
                local = [name for name in self._order if name not in remote]
                if progress is not None and (checked is None or not local):
                    progress(i, spec)
                parts = (
                    [checked[i] if checked is not None else check(spec, frameworks=local, registry=self._registry)]
                    if local
                    else []
                )
                if i in sent:
                    parts.append(self._remote_result(spec, remote, *sent[i], objects))
                results.append(parts[0] if len(parts) == 1 else merge_parts(parts, self._order))
        return results


def _tensor_bytes(spec: NormSpec) -> int:
    return sum(getattr(tensor, "nbytes", 0) for tensor in spec.tensors.values())


class _Batch:
    """The worker's legs of several specs, asked in one request (WorkerConnection.submit_many: checked by `check_many`).
    If the request raises, each of its specs is asked alone, so that the error raised is the first spec's own,
    in order."""

    def __init__(self, worker: WorkerConnection, specs: list[NormSpec], remote: list[str]):
        self.worker, self.specs, self.remote = worker, specs, remote
        self.future = worker.submit_many(specs, remote, defer_round_trips=True)
        self.alone: list | None = None

    def result(self, position: int) -> CheckResult:
        try:
            return self.future.result()[position]
        except WorkerGone:
            raise
        except Exception:  # noqa: BLE001  asked again spec by spec, which raises it for the spec it belongs to
            if self.alone is None:
                self.alone = [self.worker.submit(spec, self.remote, defer_round_trips=True) for spec in self.specs]
            return self.alone[position].result()


__all__ = ["IN_PROCESS", "SharedWorker", "SplitCheck", "expected_framework", "start_spread"]
