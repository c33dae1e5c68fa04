"""The equivalence gate: `converters.check` over every normalizer of a model, and everything that runs it.

- `gates.py`: `Gate`, how a registry runs the gate, and its three kinds (in process, a child worker, the shared
  worker); the registry is given one (`Registry(gate=...)`).
- `split_check.py`: `SplitCheck`, a model's checks split by framework between this process and a worker (a leg: the part
  of one layer's check that runs on some of its target frameworks in one process), and the pool of live workers.
- `grouped_check.py`: `check_many`, the checks of many layers with each framework object built once per configuration,
  by `group_objects.py` (`GroupObjects`); `kept_objects.py` keeps them between calls.
- `merging.py`: one result from legs run in different processes; `round_trips.py`: a worker's round trips back to the
  source framework, left to its caller.
- the worker processes: `check_worker.py` (the process and its frames), `worker_client.py` (the caller's side, a
  private child on pipes), `shared_worker.py` (one warm worker per user on a Unix socket, serving every CLI process and
  the jobs its callers register).

The single-layer check itself is converters/equivalence.py (`converters.check`). Names here are imported on first use:
`converters.equivalence` imports `round_trips` from here, and the gates import `converters.equivalence`.
"""

from importlib import import_module

#: name -> module here, imported when first asked for.
_NAMES = {
    "Gate": "gates",
    "InProcessGate": "gates",
    "ChildWorkerGate": "gates",
    "SharedWorkerGate": "gates",
    "CheckProgress": "gates",
    "expected_framework": "split_check",
    "check_many": "grouped_check",
}


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(import_module(f".{_NAMES[name]}", __name__), name)
    raise AttributeError(f"module 'converters.gate' has no attribute '{name}'")


__all__ = sorted(_NAMES)
