"""The FastAPI application: one Registry per process, per-request `as_user`, one error shape.

`create_app(registry, insecure_local=..., max_upload_bytes=..., host=..., allowed_hosts=...)` is what
`normbridge serve` runs with one worker; with several, uvicorn imports `app_from_env` (a factory) in
each worker, which rebuilds the same app from the NORMBRIDGE_* variables serve sets. Every request
passes the request guard first (request_guard.py: Host, Origin, Content-Type), inside the metrics middleware
(metrics.py: GET /metrics). /docs and /redoc load
their scripts from this server (api_docs.py), never from a CDN.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from converters.gate import ChildWorkerGate
from fastapi import FastAPI

from registry import drift_history
from registry.service import Registry
from registry.tokens import TokenStore
from registry.web import install as install_web_pages

from . import routes_blobs, routes_drift, routes_model_file, routes_read, routes_write
from .api_docs import install as install_api_docs
from .errors import install_error_handlers
from .metrics import history_windows, install as install_metrics
from .request_guard import ALLOWED_HOSTS_ENV, HostPolicy, RequestGuard, declare_refusals, is_loopback
from .responses import SafeJSONResponse
from .uploads import remove_orphaned_workspaces

DEFAULT_MAX_UPLOAD_BYTES = 2048 * 1024 * 1024
#: Environment read by `app_from_env` (set by `normbridge serve` for its workers).
INSECURE_ENV = "NORMBRIDGE_SERVE_INSECURE_LOCAL"
HOST_ENV = "NORMBRIDGE_SERVE_HOST"
MAX_UPLOAD_ENV = "NORMBRIDGE_SERVE_MAX_UPLOAD_BYTES"


def create_app(
    registry,
    *,
    insecure_local: bool = False,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    host: str = "127.0.0.1",
    allowed_hosts: Iterable[str] = (),
) -> FastAPI:
    """The HTTP API over `registry` (a registry.service.Registry); see the API contract in README.md.

    `host` is the address the server binds and `allowed_hosts` the extra names it answers to (see request_guard): an
    in-process client such as Starlette's TestClient, which sends Host 'testserver',
    passes allowed_hosts=["testserver"].
    """
    app = FastAPI(
        title="normbridge registry",
        version=routes_read.package_version(),
        default_response_class=SafeJSONResponse,
        description="Model versions behind a normalization-equivalence gate: read, register, diff, lineage, aliases, audit.",
        docs_url=None,
        redoc_url=None,
    )  # api_docs serves them from installed files, not a CDN
    app.state.registry = registry
    app.state.tokens = TokenStore(registry.meta)
    app.state.insecure_local = bool(insecure_local)
    app.state.max_upload_bytes = int(max_upload_bytes)
    app.state.register_lock = threading.Lock()  # see routes_write._one_at_a_time
    install_error_handlers(app)
    remove_orphaned_workspaces()
    for module in (routes_read, routes_write, routes_blobs, routes_drift, routes_model_file):
        app.include_router(module.router)
    install_web_pages(app)
    install_api_docs(app)
    app.add_middleware(RequestGuard, hosts=HostPolicy.serving(host, allowed_hosts))
    install_metrics(
        app, registry, (history_windows(drift_history.current),)
    )  # outermost: guard refusals are counted too (GET /metrics, docs/metrics.md)
    _declare_guard_in_openapi(app)
    return app


def _declare_guard_in_openapi(app: FastAPI) -> None:
    """/openapi.json lists the guard's refusals (403 on every operation, 415 on state-changing ones):
    it runs before any route."""
    generate = app.openapi

    def openapi() -> dict:
        fresh = app.openapi_schema is None
        schema = generate()
        return declare_refusals(schema) if fresh else schema

    app.openapi = openapi


def app_from_env() -> FastAPI:
    """Factory for uvicorn workers: the app of NORMBRIDGE_DB / NORMBRIDGE_BLOBS and the serve options in the
    environment."""
    insecure = os.environ.get(INSECURE_ENV) == "1"
    if insecure and not is_loopback(os.environ.get(HOST_ENV, "")):
        raise RuntimeError(
            f"{INSECURE_ENV}=1 is only allowed with a loopback {HOST_ENV}; anonymous admin access must stay on this machine."
        )
    limit = int(os.environ.get(MAX_UPLOAD_ENV, DEFAULT_MAX_UPLOAD_BYTES))
    allowed = [value for value in os.environ.get(ALLOWED_HOSTS_ENV, "").split(",") if value]
    # A server is long-lived: a child worker of its own checks the frameworks it has not imported (no shared worker).
    registry = Registry(
        db=os.environ.get("NORMBRIDGE_DB"),
        blobs=os.environ.get("NORMBRIDGE_BLOBS"),
        user="server",
        gate=ChildWorkerGate(),
    )
    return create_app(
        registry,
        insecure_local=insecure,
        max_upload_bytes=limit,
        host=os.environ.get(HOST_ENV, "127.0.0.1"),
        allowed_hosts=allowed,
    )


__all__ = ["ALLOWED_HOSTS_ENV", "DEFAULT_MAX_UPLOAD_BYTES", "app_from_env", "create_app", "is_loopback"]
