"""The CLI's gate, and a registration as a job of the warm shared gate worker: a CLI process that finds it running
imports no framework.

`cli_gate` is the one place that reads the settings choosing where a CLI process's gate runs (registry/settings.py: the
shared worker, or a child of each process) and builds that `Gate`; the shared worker is started with this module's jobs
(`worker_jobs`, registered explicitly: the worker calls the function the CLI passed, converters/gate/shared_worker.py).

Why: a cold `normbridge register` of a .pt2 spent about 2.4 s of its 4 s importing torch and torch's .pt2 deserializer
(which imports torch._dynamo), work the shared worker (converters/gate/shared_worker.py) did once when it started. When
that worker runs, the CLI sends it the registration (the store's locations, the user, the model's path and the options)
and prints what comes back: the worker runs `Registry.register` itself, the same code on the same store, with every
framework's checks of the gate in its own process. Errors come back as their class, message, layer and setting, so the
exit code and the message are the ones an in-process registration gives (a relative model path is named as the caller
gave it).

Only a registry of a local SQLite database and a local blob folder is registered this way: both are paths
the worker, a process of the same user, opens as the caller would; a server's credentials may live in the
caller's environment, which the worker does not share. And only when the worker already runs: otherwise the
caller registers in process, starting the worker for the next registration. NORMBRIDGE_REGISTER_IN_WORKER=0
turns it off. A registration is all or nothing, so a worker that dies before answering leaves either no
version or the whole one: the caller then registers in process, which finds identical content registered.

The worker's gate spreads its checks over two processes (a `ChildWorkerGate` with `spread`, converters/gate/gates.py):
the Keras checks of a .pt2's normalizers (the torch checks of a .keras model's) run in a second warm process, the
worker's child, while the worker runs the others, so on two cores a registration's gate takes about its longest
framework per normalizer instead of their sum. That child is started when the worker has run its first registration (not
before: its imports, several seconds of CPU, would slow the first registration on a machine, which the CLI runs while
the worker starts), is kept for every later one, and holds TensorFlow and torch a second time (about 0.8 GB);
NORMBRIDGE_SPREAD_LEGS=0 in the caller's environment turns it off (the caller then reaches a worker of its own:
shared_worker.worker_environment), as does a machine with one core, where it gains nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from converters.adapters import REGISTRY
from converters.gate import ChildWorkerGate, Gate, SharedWorkerGate
from converters.gate.shared_worker import WorkerJobs, run_job
from schemas import CheckResult, NormbridgeError
from schemas.manifest import UnrecognisedLayer

from . import settings
from .entities import Registration, VersionRecord

SWITCH_ENV = "NORMBRIDGE_REGISTER_IN_WORKER"
#: Set when a test makes a registration die at a named point (registry/faults.py): that must happen in the caller.
FAULT_ENV = "NORMBRIDGE_FAULT"
#: "0" turns off the spread of the worker's gate over a second process (see above).
SPREAD_ENV = "NORMBRIDGE_SPREAD_LEGS"
#: The frameworks the worker's gate checks in its second process, each for the specs of the other framework's models.
SPREAD = ("torch", "keras")

Progress = Callable[[str, int, int], None]


def cli_gate(adapters=REGISTRY) -> Gate:
    """The gate of a CLI process: the shared worker's (with this module's jobs) unless NORMBRIDGE_GATE_WORKER=private,
    then a child worker of this process's own. Raises RegistryError for a setting that is not understood."""
    shared = settings.gate_worker()
    if shared is None:
        return ChildWorkerGate(adapters)
    return SharedWorkerGate(shared[0], shared[1], jobs=worker_jobs, adapters=adapters)


def local_store(db: str | None, blobs: str | None) -> tuple[str, str] | None:
    """(absolute SQLite URL, absolute blob folder) of a local registry, None for any other (a server's database, S3)."""
    url, folder = settings.database_url(db), settings.blobs_uri(blobs)
    if not url.startswith("sqlite:///") or url == "sqlite:///:memory:" or "?" in url:
        return None
    if "://" in folder:
        if not folder.startswith("file://"):
            return None
        folder = folder.removeprefix("file://")
    return f"sqlite:///{Path(url.removeprefix('sqlite:///')).absolute()}", str(Path(folder).absolute())


def register_in_worker(
    folder: Path,
    packages: dict[str, str],
    name: str,
    model: Path,
    db: str | None,
    blobs: str | None,
    parent: str | None,
    note: str | None,
    operation: str | None,
    allow_unrecognised: bool,
    progress: Progress | None = None,
) -> Registration | None:
    """`Registry(db, blobs).register(name, model, ...)` run by the shared worker of `folder`, if one runs and the
    registry is local; None when it was not run there (the caller registers in process).
    Raises the registration's error."""
    store = local_store(db, blobs)
    if store is None or os.environ.get(SWITCH_ENV) == "0" or os.environ.get(FAULT_ENV) or not Path(model).exists():
        return None
    path = Path(model).absolute()
    args = {
        "db": store[0],
        "blobs": store[1],
        "user": settings.current_user(),
        "name": name,
        "model": str(path),
        "model_input": str(model),
        "parent": parent,
        "note": note,
        "operation": operation,
        "allow_unrecognised": allow_unrecognised,
    }
    told = None if progress is None else (lambda fields: progress(str(fields[0]), int(fields[1]), int(fields[2])))
    try:
        answer = run_job(folder, packages, worker_jobs, "register", args, told)
    except NormbridgeError as error:
        if str(path) != str(model):
            error.message = error.message.replace(str(path), str(model))
            error.args = (error.message,)
        raise
    return None if answer is None else registration_from_json(answer)


#: The gate of the registrations this worker runs: every framework here until `_spread` spreads some to a child.
_GATE = ChildWorkerGate()


def register_job(args: dict, progress: Callable[[list], None]) -> dict:
    """The worker's side: the registration `register_in_worker` asked for, every framework's checks in this process
    (some in its spread child from the second job on)."""
    from .service import Registry  # the worker's side only: a CLI that hands the job over never imports it

    for (
        framework
    ) in REGISTRY.framework_names:  # so the gate finds every framework here instead of starting a worker of its own
        REGISTRY.framework(framework).version()
    registry = Registry(db=args["db"], blobs=args["blobs"], user=args["user"], gate=_GATE)
    try:
        result = registry.register(
            args["name"],
            Path(args["model"]),
            parent=args.get("parent"),
            note=args.get("note"),
            operation=args.get("operation"),
            allow_unrecognised=bool(args.get("allow_unrecognised")),
            progress=lambda step, done, total: progress([step, done, total]),
            model_input=args.get("model_input"),
        )
    finally:
        registry.meta.close()
        _spread()  # after the first job, not before: its imports would slow the registration that started the worker
    return registration_to_json(result)


def prepare(frameworks: list[str]) -> None:
    """Ready the worker for a registration of a model of `frameworks` (it has imported them and their readers): import
    the registry's service (about 0.5 s), as a job's first registration otherwise does while its caller waits."""
    from .service import Registry  # noqa: F401


def _spread() -> None:
    """Have the gates of this worker's registrations spread their checks over a second warm process (started now if none
    lives), unless turned off or the machine has one core."""
    global _GATE
    if os.environ.get(SPREAD_ENV) != "0" and len(os.sched_getaffinity(0)) > 1:
        if not _GATE.spread:
            _GATE = ChildWorkerGate(spread=SPREAD)
        _GATE.start_spread()  # a child that died since the last job is started again


def worker_jobs() -> WorkerJobs:
    """The jobs the shared worker runs for CLI processes: a registration (the worker calls this once, as the CLI
    registered it: cli_gate)."""
    return WorkerJobs({"register": register_job}, prepare)


def registration_to_json(result: Registration) -> dict:
    """A Registration as JSON values (checks keep their infinities: both ends are Python's json)."""
    version = {
        key: (value.isoformat() if key == "created_at" else value) for key, value in vars(result.version).items()
    }
    return {
        "version": version,
        "created": result.created,
        "checks": [c.model_dump(mode="python") for c in result.checks],
        "unrecognised": [u.model_dump(mode="json") for u in result.unrecognised],
        "seconds": result.seconds,
    }


def registration_from_json(document: dict) -> Registration:
    """The Registration `registration_to_json` sent."""
    from pydantic import TypeAdapter

    return Registration(
        version=TypeAdapter(VersionRecord).validate_python(document["version"]),
        created=bool(document["created"]),
        checks=[CheckResult.model_validate(c) for c in document["checks"]],
        unrecognised=[UnrecognisedLayer.model_validate(u) for u in document["unrecognised"]],
        seconds=dict(document.get("seconds") or {}),
    )


__all__ = [
    "SWITCH_ENV",
    "cli_gate",
    "local_store",
    "prepare",
    "register_in_worker",
    "registration_from_json",
    "registration_to_json",
    "worker_jobs",
]
