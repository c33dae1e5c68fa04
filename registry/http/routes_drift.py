"""The drift history over HTTP: a serving collector posts statistics windows, operators read the history and its state.

POST .../drift/reports stores an offline check (`normbridge --server URL drift MODEL DATA --record NAME@N`), refused
(409) when the report's statistics digest is not the version's. POST needs role write on the model (the collector's
token can be scoped to the one model it serves); GET needs read. The offline checks recorded by `normbridge drift
--record` come back in the same answer (`reports`, the newest summarised in `offline`); they never move `state`,
which serving windows alone move.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Request, Response

from registry.drift_history import history, store_window
from registry.drift_records import drift_reports, record_drift
from schemas.monitoring import DriftWindow, WindowRecord
from schemas.serving import DriftReport

from .api_models import DriftList, DriftRecord
from .auth import Principal, require
from .context import error_responses, registry_for, version_ref
from .request_guard import JSON, body_of

router = APIRouter(prefix="/api/v1")
# A body is at most 32 MiB (body_limits.MAX_JSON_BYTES: a hundred layers of 2048 channels is about 8 MB of JSON),
# refused by the request guard before FastAPI reads it; the per-field bounds of schemas.monitoring bound what is
# validated.
Reader = Annotated[Principal, Depends(require("read"))]
Writer = Annotated[Principal, Depends(require("write"))]


@router.post(
    "/models/{name}/versions/{ref}/drift",
    status_code=201,
    response_model=WindowRecord,
    tags=["write"],
    dependencies=[Depends(body_of(JSON))],
    responses={
        200: {
            "model": WindowRecord,
            "description": "The same window was posted before: the stored window (it counts once).",
        },
        201: {"model": WindowRecord, "description": "A new window was stored."},
        **error_responses(400, 401, 403, 404, 409, 413, 415, 422, 500),
    },
    summary="Store one statistics window of a served version (what converters.monitor ships); returns it with the new state "
    "(200 with the stored window when the same window was posted before: it counts once)",
)
def post_window(
    name: str, ref: str, request: Request, response: Response, principal: Writer, window: Annotated[DriftWindow, Body()]
) -> WindowRecord:
    principal.check("write", name)
    record, created = store_window(registry_for(request, principal), version_ref(name, ref), window)
    if not created:
        response.status_code = 200
    return record


@router.get(
    "/models/{name}/versions/{ref}/drift",
    response_model=DriftList,
    tags=["read"],
    responses=error_responses(401, 403, 404, 409, 422, 500),
    summary="A version's drift history (newest window first), its serving state ok|warning|alert|serving_fault (moved by serving windows "
    "only), and its recorded offline checks beside it",
)
def get_history(
    name: str,
    ref: str,
    request: Request,
    principal: Reader,
    limit: Annotated[int, Query(ge=0, le=10_000, description="Newest windows to return.")] = 100,
) -> DriftList:
    principal.check("read", name)
    registry = registry_for(request, principal)
    found = history(registry, version_ref(name, ref), limit=limit)
    return DriftList(**dict(found), reports=drift_reports(registry, version_ref(name, ref)))


@router.post(
    "/models/{name}/versions/{ref}/drift/reports",
    status_code=201,
    response_model=DriftRecord,
    tags=["write"],
    dependencies=[Depends(body_of(JSON))],
    responses=error_responses(400, 401, 403, 404, 409, 413, 415, 422, 500),
    summary="Record an offline drift check (`normbridge drift --record`) against the version it was computed on",
)
def post_report(
    name: str, ref: str, request: Request, principal: Writer, report: Annotated[DriftReport, Body()]
) -> DriftRecord:
    principal.check("write", name)
    return record_drift(registry_for(request, principal), version_ref(name, ref), report)
