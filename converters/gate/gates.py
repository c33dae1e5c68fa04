"""`Gate`: how a registry runs the equivalence gate over a model's normalizers, chosen by whoever builds the registry.

Every gate gives the results `converters.check` gives each spec, field for field (a registration refuses a model on
them); they differ only in where the checks run, which is a matter of time and memory. A leg is the part of one
layer's check that runs on some of its target frameworks, in one process (converters/gate/split_check.py, which does
the work for all three):

- `InProcessGate`: every check in this process (`converters.check_many`): it imports every framework.
- `ChildWorkerGate` (the registry's default): the legs of frameworks this process has not imported run in a worker
  that is this process's child (it ends with it), so registering a .pt2 never imports TensorFlow here. With `spread`,
  the named legs run in that child even where this process has their framework (a process holding every framework,
  such as the shared worker running a registration: both cores work on one gate).
- `SharedWorkerGate`: the legs go to the warm shared worker of a folder, which outlives this process and serves the
  next one warm (the CLI's choice: a short-lived process should not pay TensorFlow's imports each time).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from schemas import CheckResult, NormSpec

from ..adapters import REGISTRY, AdapterRegistry
from . import shared_worker
from .split_check import SharedWorker, SplitCheck, expected_framework, start_spread

#: progress(i, spec): called as the checks of the i-th spec start.
CheckProgress = Callable[[int, NormSpec], None]


class Gate(ABC):
    """Checks every normalizer of one model, as `converters.check` would."""

    def __init__(self, adapters: AdapterRegistry = REGISTRY):
        self.adapters = adapters

    def expect(self, model: Any) -> None:
        """Ready what checking `model` will need before it is read (a worker starts importing the frameworks it does not
        use, overlapping the caller's own work). Nothing by default; optional for callers: `check_all` works without."""

    @abstractmethod
    def check_all(self, specs: Sequence[NormSpec], progress: CheckProgress | None = None) -> list[CheckResult]:
        """`check(spec)` of every spec of one model, in order. Raises what `check` raises, for the first spec it raises
        on."""


class InProcessGate(Gate):
    """Every check in this process."""

    def check_all(self, specs, progress=None):
        return SplitCheck(registry=self.adapters, in_worker=[]).check_all(specs, progress)


class ChildWorkerGate(Gate):
    """The legs of frameworks this process has not imported (and the `spread` ones) in a child worker process."""

    def __init__(self, adapters: AdapterRegistry = REGISTRY, spread: Sequence[str] = ()):
        super().__init__(adapters)
        self.spread = tuple(spread)

    def start_spread(self) -> Future | None:
        """Start the child the spread legs run in now, off the next gate's clock; the future of its warm-up (None when
        nothing is spread). A gate that finds it still importing runs those legs here."""
        return start_spread(self.spread, self.adapters.packages)

    def expect(self, model):
        SplitCheck(expected_framework(model), registry=self.adapters, spread=self.spread)

    def check_all(self, specs, progress=None):
        return SplitCheck(registry=self.adapters, spread=self.spread).check_all(specs, progress)


class SharedWorkerGate(Gate):
    """The legs of frameworks this process has not imported in the warm shared worker of `folder` (started if none
    runs; it exits after `idle` seconds without a caller, and runs the jobs `jobs` registers for its callers). Where
    that worker cannot be used (a folder open to others, a worker that fails to start) a private child runs them, with
    a warning."""

    def __init__(
        self,
        folder: str | Path,
        idle: float = shared_worker.DEFAULT_IDLE_SECONDS,
        jobs: shared_worker.JobSource | None = None,
        adapters: AdapterRegistry = REGISTRY,
    ):
        super().__init__(adapters)
        self.worker = SharedWorker(Path(folder), float(idle), jobs)

    def expect(self, model):
        SplitCheck(expected_framework(model), registry=self.adapters, shared=self.worker)

    def check_all(self, specs, progress=None):
        return SplitCheck(registry=self.adapters, shared=self.worker).check_all(specs, progress)


__all__ = ["CheckProgress", "ChildWorkerGate", "Gate", "InProcessGate", "SharedWorkerGate"]
