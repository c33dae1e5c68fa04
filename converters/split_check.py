"""The equivalence gate over a model's normalizers, each framework's leg run where it costs least.

`check(spec)` converts a layer to every framework; a registration of a .pt2 would import TensorFlow
for the Keras leg (about 4 s) and one of a .keras would import torch. Here a leg runs in this
process when its framework is imported here already, is the spec's own (reading the model imported
it), or is light to import (ONNX); otherwise it runs in a worker process (converters/leg_worker.py),
started when the gate learns the model's framework, so its imports overlap reading the model, and
kept for the next registration. Each leg is `converters.check` on the same spec and `merge_legs`
puts the worker's entries where an in-process check puts them: the results are the ones
`check(spec)` gives, passed or failed (tests/converters/test_split_check.py compares them).
"""

from __future__ import annotations

import atexit
import json
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import converters
from schemas import CheckResult, NormSpec, NormbridgeError

from .adapters import MODEL_FILES, REGISTRY
from .equivalence import check, merge_legs
from .leg_worker import LegWorker

#: Frameworks whose legs always run in process: onnx and onnxruntime import in under a second, less than a worker costs.
IN_PROCESS = ("onnx",)

_WORKERS: dict[tuple[str, tuple[str, ...]], LegWorker] = {}
_WORKERS_LOCK = threading.Lock()


def imported(framework: str) -> bool:
    """Whether this process has imported `framework` (its name is its top-level package: converters/adapters.py)."""
    return framework in sys.modules


def expected_framework(model: Any) -> str | None:
    """The framework a model file or object belongs to, told without reading it (None: not known before reading)."""
    if isinstance(model, (str, Path)):
        return MODEL_FILES.get(Path(model).suffix.lower(), (None, None))[0]
    try:
        return REGISTRY.model_framework(model)
    except NormbridgeError:
        return None


def _worker(packages: dict[str, str], frameworks: tuple[str, ...]) -> LegWorker:
    """The live worker with these adapter packages, warmed with `frameworks`, started if there is none (reused by later
    registrations)."""
    key = (json.dumps(packages, sort_keys=True), frameworks)
    with _WORKERS_LOCK:
        worker = _WORKERS.get(key)
        if worker is None or not worker.alive():
            worker = _WORKERS[key] = LegWorker(list(frameworks), packages)
        return worker


@atexit.register
def _close_workers() -> None:
    """At exit, end the workers and reap them: no orphan outlives the process."""
    for worker in _WORKERS.values():
        worker.close()


class SplitCheck:
    """`check` for every spec of one model; legs of frameworks this process has not imported run in a worker."""

    def __init__(self, model_framework: str | None = None, registry=REGISTRY, in_worker: Sequence[str] | None = None):
        """`in_worker` names the legs to run in the worker whatever this process has imported (the tests compare both ways)."""
        self._registry = registry
        self._order = registry.framework_names
        self._in_worker = None if in_worker is None else list(in_worker)
        if model_framework is not None and self._remote_legs(model_framework):
            self._worker_for(model_framework)  # starts importing now

    def _remote_legs(self, own: str) -> list[str]:
        if self._in_worker is not None:
            return [name for name in self._order if name in self._in_worker]
        return [name for name in self._order if name != own and name not in IN_PROCESS and not imported(name)]

    def _local_all(self, plans: list, progress: Callable[[int, NormSpec], None] | None) -> list[CheckResult | None] | None:
        """Every spec's legs in this process, through `converters.check_many` (each object built once per configuration; the
        public entry point, looked up now: a caller may wrap it); None if it raises, so that each spec is then checked alone
        and the error raised is the first spec's, in order."""
        by_legs: dict[tuple[str, ...], list[int]] = {}
        for i, (_, remote, _) in enumerate(plans):
            legs = tuple(name for name in self._order if name not in remote)
            if legs:
                by_legs.setdefault(legs, []).append(i)
        results: list[CheckResult | None] = [None] * len(plans)
        try:
            for legs, indices in by_legs.items():
                told = None if progress is None else lambda j, spec, indices=indices: progress(indices[j], spec)
                checked = converters.check_many([plans[i][0] for i in indices], frameworks=list(legs), registry=self._registry, progress=told)
                for i, result in zip(indices, checked):
                    results[i] = result
        except Exception:  # noqa: BLE001  checked again spec by spec, which raises it in order
            return None
        return results

    def _worker_for(self, own: str) -> LegWorker:
        # The worker converts back to the spec's own framework too (the round trip), so it warms that one as well.
        return _worker(self._registry.packages, tuple(dict.fromkeys([*self._remote_legs(own), *([own] if own in self._order else [])])))

    def check_all(self, specs: Sequence[NormSpec], progress: Callable[[int, NormSpec], None] | None = None) -> list[CheckResult]:
        """`check(spec)` of every spec, in order; the worker's legs are all sent first, so both processes work at once.
        Raises what `check` raises, for the first spec it raises on."""
        plans = []
        for spec in specs:
            own = spec.source.framework
            remote = self._remote_legs(own)
            plans.append((spec, remote, self._worker_for(own).submit(spec, remote) if remote else None))
        checked = self._local_all(plans, progress)
        results = []
        for i, (spec, remote, future) in enumerate(plans):
            local = [name for name in self._order if name not in remote]
            if progress is not None and (checked is None or not local):
                progress(i, spec)
            parts = [checked[i] if checked is not None else check(spec, frameworks=local, registry=self._registry)] if local else []
            if future is not None:
                parts.append(future.result())
            results.append(parts[0] if len(parts) == 1 else merge_legs(parts, self._order))
        return results


__all__ = ["IN_PROCESS", "SplitCheck", "expected_framework", "imported"]
