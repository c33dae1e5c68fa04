"""Which registry a command works on, and handing a registration to where it runs cheapest.

The local Registry (SQLite and a blob folder under NORMBRIDGE_HOME unless --db / --blobs say otherwise) or, with
--server, a RemoteRegistry; a registration into a local registry that finds the shared gate worker running is run
by that worker (registry/worker_jobs.py), so the CLI process imports no framework.
"""

from __future__ import annotations

import dataclasses
import sys
from datetime import datetime
from pathlib import Path

from . import remote

DB_HELP = "SQLAlchemy URL of the metadata database (env NORMBRIDGE_DB; default SQLite under NORMBRIDGE_HOME)."
BLOBS_HELP = "Blob store: a folder or file:// URI (env NORMBRIDGE_BLOBS; default NORMBRIDGE_HOME/blobs)."


def _registry(db: str | None, blobs: str | None, quiet: bool = False, gate_for: Path | None = None):
    """The local Registry, or a RemoteRegistry when --server / NORMBRIDGE_SERVER is set (byte bars unless `quiet`).

    `gate_for`: a model about to be registered here; the gate's worker for the frameworks it does not use is asked for
    (and started, if none runs) before anything else is imported, so its imports overlap this process's."""
    client = remote.remote_registry(db, blobs, quiet=quiet)
    if client is not None:
        return client
    from registry.worker_jobs import cli_gate

    # A CLI process is short-lived: the checks of frameworks it has not imported go to the warm shared worker, which
    # also runs the next registration whole (registry/worker_jobs.py).
    gate = cli_gate()
    if gate_for is not None:
        gate.expect(gate_for)  # the registration's gate finds this worker
    from registry.service import Registry

    return Registry(db=db, blobs=blobs, gate=gate)


_JSON_SCALARS = (str, int, float, bool, type(None))


def _plain(value):
    """JSON-ready form of records (dataclasses with datetimes) and pydantic results; scalars first, since a version's
    manifest is thousands of them."""
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


def _dump(value) -> None:
    """Print `value` as indented JSON (UTF-8; infinities as Infinity, as Python's json writes them). pydantic_core's
    encoder: the standard library's pure-Python indented one took 25 ms per 600 kB (a 53-layer model's manifest)."""
    from pydantic_core import to_json

    sys.stdout.flush()
    sys.stdout.buffer.write(to_json(_plain(value), indent=2, inf_nan_mode="constants") + b"\n")
    sys.stdout.buffer.flush()


def _register(name: str, model: Path, db: str | None, blobs: str | None, quiet: bool, progress, options: dict):
    """In the warm shared worker when one runs and the registry is local (registry/worker_jobs.py: this process then
    imports no framework), else here (starting that worker for the next registration)."""
    if remote.options.server is None:
        from converters.adapters import REGISTRY
        from registry.settings import gate_worker
        from registry.worker_jobs import register_in_worker

        shared = gate_worker()
        done = (
            None
            if shared is None
            else register_in_worker(shared[0], REGISTRY.packages, name, model, db, blobs, progress=progress, **options)
        )
        if done is not None:
            return done
    return _registry(db, blobs, quiet, gate_for=model).register(name, model, progress=progress, **options)
