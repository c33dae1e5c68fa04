"""Write endpoints: register an upload behind the equivalence gate, move an alias, collect garbage.

Each runs as the token's owner (Registry.as_user), so the audit log names who did it; a refused
registration is audited by Registry.register itself ('register_failed').
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, Path as PathParam, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from converters.heap import settled_after_imports
from registry.bundle_stream import UploadInterrupted
from registry.service.results import GcResult

from .api_models import Alias, AliasBody, Registered, Version
from .auth import Principal, require
from .body_pipe import BodyPipe, send_body
from .routes_blobs import reusable_blobs
from .context import error_responses, model_of, registry_for
from .errors import forbidden
from .redaction import Redactor
from .request_guard import JSON, UPLOAD_MEDIA_TYPES, body_of
from .uploads import (
    SUFFIXES,
    ZIP_FORMATS,
    new_workspace,
    receive_body,
    refuse_declared_excess,
    refuse_unpacked_excess,
    remove_workspace,
)

#: What an upload's body is: a model file of a framework's structure format (FrameworkInfo), or a bundle.
UploadFormat = Literal[(*SUFFIXES, "bundle")]

router = APIRouter(prefix="/api/v1")
Writer = Annotated[Principal, Depends(require("write"))]
Admin = Annotated[Principal, Depends(require("admin"))]

UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": (
            "The raw model file (.onnx, .keras, .pt2), received whole before it is read; or, for format=bundle, a tar "
            "(plain or gzip) of an artifact folder (manifest.json and blobs/<sha256>.safetensors), checked while it "
            "arrives: send manifest.json first, then the blobs of the normalizers' tensors, so the equivalence gate "
            "starts before the bulk weights have arrived."
        ),
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
        },  # also x-tar, gzip (request_guard)
    }
}


@router.post(
    "/models/{name}/versions",
    status_code=201,
    response_model=Registered,
    tags=["write"],
    openapi_extra=UPLOAD_BODY,
    dependencies=[Depends(body_of(*UPLOAD_MEDIA_TYPES, optional=True))],
    summary="Register an uploaded model as the next version, only if every normalizer passes the equivalence check",
    responses={
        200: {"model": Registered, "description": "Identical content is already registered: the existing version."},
        201: {"model": Registered, "description": "A new version was registered."},
        **error_responses(400, 401, 403, 404, 409, 413, 415, 422, 500, 507),
    },
)
async def register(
    request: Request,
    principal: Writer,
    name: Annotated[str, PathParam(description="Model name (letters, digits, '.', '_', '-').")],
    file_format: Annotated[UploadFormat, Query(alias="format", description="What the body is.")],
    parent: Annotated[
        str | None, Query(description="Parent version NAME@N (default: the latest version of NAME).")
    ] = None,
    note: Annotated[str | None, Query(description="Free-text note stored with the version.")] = None,
    operation: Annotated[
        str | None, Query(description="registered, fine-tuned, recalibrated, converted, imported.")
    ] = None,
    allow_unrecognised: Annotated[
        bool,
        Query(
            description="Register a model holding normalization no recognizer proved; "
            "those layers are recorded as unchecked."
        ),
    ] = False,
):
    principal.check("write", name)
    if parent is not None:
        principal.check("read", model_of(parent))
    limit = request.app.state.max_upload_bytes
    registry = registry_for(request, principal)
    lock = request.app.state.register_lock
    if file_format == "bundle":
        result = await _register_streamed_bundle(
            request, principal, lock, registry, name, limit, parent, note, operation, allow_unrecognised
        )
    else:
        workspace = new_workspace()
        try:
            received = workspace / f"upload{SUFFIXES[file_format]}"
            await receive_body(request, received, limit)
            if file_format in ZIP_FORMATS:
                await run_in_threadpool(refuse_unpacked_excess, received, limit)  # reads the central directory only
            with request.app.state.metrics.gate_timer() as timer:
                result = await run_in_threadpool(
                    _one_at_a_time,
                    lock,
                    registry.register,
                    name,
                    received,
                    parent=parent,
                    note=note,
                    operation=operation,
                    allow_unrecognised=allow_unrecognised,
                    progress=timer,
                )
        finally:
            remove_workspace(workspace)
    body = Registered(
        created=result.created,
        version=Version.model_validate(Redactor(principal).version(result.version)),
        checks=result.checks,
        unrecognised=result.unrecognised,
    )
    return Response(body.model_dump_json(), status_code=201 if result.created else 200, media_type="application/json")


async def _register_streamed_bundle(
    request: Request,
    principal: Principal,
    lock,
    registry,
    name,
    limit,
    parent,
    note,
    operation,
    allow_unrecognised: bool,
):
    """Read the bundle in a worker thread while the event loop feeds it the body (see registry.bundle_stream)."""
    await refuse_declared_excess(request, limit)
    pipe = BodyPipe()

    def reuse(digests: set[str]) -> set[str]:  # blobs this token may read may be left out (POST /api/v1/blobs/present)
        return reusable_blobs(registry, principal, digests)

    def read_and_register():
        try:
            with request.app.state.metrics.gate_timer() as timer:  # the gate's duration (GET /metrics)
                return registry.register_stream(
                    name,
                    pipe,
                    limit,
                    parent=parent,
                    note=note,
                    operation=operation,
                    reuse=reuse,
                    allow_unrecognised=allow_unrecognised,
                    progress=timer,
                )
        finally:
            pipe.abandon()  # the reader is done: the sender drops the rest of the body instead of waiting

    work = asyncio.ensure_future(run_in_threadpool(_one_at_a_time, lock, read_and_register))
    try:
        await send_body(request, pipe, limit)
    finally:
        pipe.finish(
            UploadInterrupted("the upload was cancelled before its end; nothing was registered.")
        )  # no-op once finished
    return await work


def _one_at_a_time(lock, register, *args, **kwargs):
    """A registration under the process's lock: loading a .pt2 is not thread-safe (torch.export keeps a global
    deserializer), so one worker registers one model at a time; run `serve --workers N` for parallel registrations.
    The registration that first imports a framework settles the heap (converters.heap), so the full collections of a
    server holding torch or TensorFlow no longer pause later requests."""
    with lock, settled_after_imports():
        return register(*args, **kwargs)


@router.put(
    "/models/{name}/aliases/{alias}",
    response_model=Alias,
    tags=["write"],
    responses=error_responses(401, 403, 404, 409, 422, 500),
    dependencies=[Depends(body_of(JSON))],
    summary="Point NAME@ALIAS at a version of NAME (every move is audited; a guarded alias refuses a version that is not servable with 409 not_servable unless force=true)",
)
def set_alias(
    name: str,
    alias: str,
    request: Request,
    principal: Writer,
    body: Annotated[AliasBody, Body()],
    force: Annotated[
        bool,
        Query(
            description="Move a guarded alias (production) to a version that is not servable anyway; "
            "the audit entry records that it was forced and what it overrode."
        ),
    ] = False,
) -> Alias:
    principal.check("write", name)
    target = str(body.version)
    if "@" in target:
        principal.check("read", model_of(target))
    return Alias.model_validate(registry_for(request, principal).set_alias(name, alias, target, force=force))


@router.post(
    "/gc",
    response_model=GcResult,
    tags=["admin"],
    responses=error_responses(401, 403, 409, 422, 500),
    summary="Delete blobs no version references and older than the grace period",
)
def gc(
    request: Request,
    principal: Admin,
    grace: Annotated[
        float, Query(ge=0, allow_inf_nan=False, description="Keep unreferenced blobs younger than this many seconds.")
    ] = 3600.0,
) -> GcResult:
    if principal.models is not None:
        raise forbidden("garbage collection touches every model; use an admin token that is not scoped to models.")
    return registry_for(request, principal).gc(grace)  # audited by Registry.gc, as a local `normbridge gc` is
