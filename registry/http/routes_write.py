"""Write endpoints: register an upload behind the equivalence gate, move an alias, collect garbage.

Each runs as the token's owner (Registry.as_user), so the audit log names who did it; a refused
registration is audited by Registry.register itself ('register_failed').
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, Path as PathParam, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from registry.service import GcResult
from schemas.errors import NormbridgeError

from .api_models import Alias, AliasBody, Registered, Version
from .auth import Principal, require
from .context import error_responses, model_of, registry_for
from .errors import forbidden
from .uploads import SUFFIXES, extract_bundle, new_workspace, receive_body, remove_workspace

router = APIRouter(prefix="/api/v1")
Writer = Annotated[Principal, Depends(require("write"))]
Admin = Annotated[Principal, Depends(require("admin"))]

UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "The raw model file (.onnx, .keras, .pt2) or, for format=bundle, a tar of an artifact folder.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.post("/models/{name}/versions", status_code=201, response_model=Registered, tags=["write"], openapi_extra=UPLOAD_BODY,
             summary="Register an uploaded model as the next version, only if every normalizer passes the equivalence check",
             responses={200: {"model": Registered, "description": "Identical content is already registered: the existing version."},
                        201: {"model": Registered, "description": "A new version was registered."},
                        **error_responses(400, 401, 403, 404, 409, 413, 415, 422, 500)})
async def register(request: Request, principal: Writer,
                   name: Annotated[str, PathParam(description="Model name (letters, digits, '.', '_', '-').")],
                   file_format: Annotated[Literal["onnx", "keras", "pt2", "bundle"], Query(alias="format", description="What the body is.")],
                   parent: Annotated[str | None, Query(description="Parent version NAME@N (default: the latest version of NAME).")] = None,
                   note: Annotated[str | None, Query(description="Free-text note stored with the version.")] = None,
                   operation: Annotated[str | None, Query(description="registered, fine-tuned, recalibrated, converted, imported.")] = None):
    principal.check("write", name)
    if parent is not None:
        principal.check("read", model_of(parent))
    limit = request.app.state.max_upload_bytes
    workspace = new_workspace()
    try:
        received = workspace / f"upload{SUFFIXES[file_format]}"
        await receive_body(request, received, limit)
        model_path = received
        registry = registry_for(request, principal)
        if file_format == "bundle":
            model_path = await run_in_threadpool(_unpack_or_audit, registry, name, received, workspace / "bundle", limit)
        result = await run_in_threadpool(_register_one_at_a_time, request.app.state.register_lock, registry, name, model_path, parent, note,
                                         operation)
    finally:
        remove_workspace(workspace)
    body = Registered(created=result.created, version=Version.model_validate(result.version), checks=result.checks)
    return Response(body.model_dump_json(), status_code=201 if result.created else 200, media_type="application/json")


def _unpack_or_audit(registry, name: str, archive, folder, limit: int):
    """extract_bundle; a refused bundle is audited as 'register_failed', like any registration the gate refuses."""
    try:
        return extract_bundle(archive, folder, limit)
    except NormbridgeError as error:
        registry.meta.record_failure(name, registry.user, {"error": error.code, "message": str(error), "layer": error.layer,
                                                           "model_input": "bundle upload"})
        raise


def _register_one_at_a_time(lock, registry, name, model_path, parent, note, operation):
    """Registry.register under the process's lock: loading a .pt2 is not thread-safe (torch.export keeps a global
    deserializer), so one worker registers one model at a time; run `serve --workers N` for parallel registrations."""
    with lock:
        return registry.register(name, model_path, parent=parent, note=note, operation=operation)


@router.put("/models/{name}/aliases/{alias}", response_model=Alias, tags=["write"], responses=error_responses(401, 403, 404, 409, 422, 500),
            summary="Point NAME@ALIAS at a version of NAME (every move is audited)")
def set_alias(name: str, alias: str, request: Request, principal: Writer, body: Annotated[AliasBody, Body()]) -> Alias:
    principal.check("write", name)
    target = str(body.version)
    if "@" in target:
        principal.check("read", model_of(target))
    return Alias.model_validate(registry_for(request, principal).set_alias(name, alias, target))


@router.post("/gc", response_model=GcResult, tags=["admin"], responses=error_responses(401, 403, 409, 422, 500),
             summary="Delete blobs no version references and older than the grace period")
def gc(request: Request, principal: Admin,
       grace: Annotated[float, Query(description="Keep unreferenced blobs younger than this many seconds.")] = 3600.0) -> GcResult:
    if principal.models is not None:
        raise forbidden("garbage collection touches every model; use an admin token that is not scoped to models.")
    registry = registry_for(request, principal)
    result = registry.gc(grace)
    registry.meta.append_audit("gc", None, None, {"deleted": len(result.deleted), "bytes_freed": result.bytes_freed,
                                                  "grace_seconds": result.grace_seconds}, registry.user)
    return result
