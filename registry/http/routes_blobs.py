"""Downloads: one blob by digest, or a whole version as a bundle (both streamed); which blobs an upload may skip.

A blob is served, or may be left out of an uploaded bundle, only when a version of a model in the
caller's scope references it; otherwise it is treated as absent, whether or not it exists, so
digests cannot be probed and no upload can claim another model's weights without sending them.
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from .api_models import DigestList, PresentBlobs
from .auth import Principal, require
from .bundles import VersionBundle
from .context import error_responses, registry_for, version_ref
from .errors import not_found
from .redaction import Redactor
from .request_guard import JSON, body_of

router = APIRouter(prefix="/api/v1")
Reader = Annotated[Principal, Depends(require("read"))]
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1024 * 1024


def reusable_blobs(registry, principal: Principal, digests) -> set[str]:
    """The digests that a version of a model `principal` may read references: what it may read, and so leave out of
    an upload (the server already holds them). Others' blobs stay invisible, whether or not they exist."""
    referencing = registry.meta.models_referencing(digests)
    return {digest for digest, models in referencing.items() if any(principal.can("read", m) for m in models)}


def _pieces(data: bytes):
    for start in range(0, len(data), CHUNK):
        yield data[start : start + CHUNK]


@router.get(
    "/blobs/{digest}",
    tags=["read"],
    response_class=StreamingResponse,
    summary="The raw bytes of a blob (re-hashed before sending)",
    responses={
        200: {
            "description": "The blob's bytes.",
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            "headers": {
                "X-Normbridge-Sha256": {"description": "The digest (sha256 hex).", "schema": {"type": "string"}}
            },
        },
        **error_responses(401, 403, 404, 409, 422, 500),
    },
)
def get_blob(digest: str, request: Request, principal: Reader) -> StreamingResponse:
    missing = not_found(
        f"no blob '{digest[:80]}' is referenced by a version this token may read; "
        "take digests from a version's manifest (GET /api/v1/models/NAME/versions/N)."
    )
    if not _DIGEST.match(digest):
        raise missing
    registry = registry_for(request, principal)
    if not reusable_blobs(registry, principal, [digest]):
        raise missing
    data = registry.store.get(digest)  # re-hashed: IntegrityError (500) rather than tampered bytes
    return StreamingResponse(
        _pieces(data),
        media_type="application/octet-stream",
        headers={"X-Normbridge-Sha256": digest, "Content-Length": str(len(data))},
    )


@router.post(
    "/blobs/present",
    response_model=PresentBlobs,
    tags=["read"],
    responses=error_responses(401, 403, 422, 500),
    dependencies=[Depends(body_of(JSON))],
    summary="Which of these blobs the server holds for this token: an upload may leave those out of its bundle",
)
def present_blobs(body: DigestList, request: Request, principal: Reader) -> PresentBlobs:
    wanted = [d for d in body.digests if _DIGEST.match(d)]
    return PresentBlobs(present=sorted(reusable_blobs(registry_for(request, principal), principal, wanted)))


@router.get(
    "/models/{name}/versions/{ref}/bundle",
    tags=["read"],
    response_class=StreamingResponse,
    summary="A version as a tar of its artifact folder (manifest.json + blobs/<digest>.safetensors)",
    responses={
        200: {
            "description": "The bundle.",
            "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}},
            "headers": {
                "X-Normbridge-Version": {"description": "NAME@N", "schema": {"type": "string"}},
                "X-Normbridge-Digest": {
                    "description": "The digest of the manifest sent: the version digest, unless a parent outside the token's scope was redacted.",
                    "schema": {"type": "string"},
                },
            },
        },
        **error_responses(401, 403, 404, 409, 422, 500),
    },
)
def get_bundle(name: str, ref: str, request: Request, principal: Reader) -> StreamingResponse:
    principal.check("read", name)
    registry = registry_for(request, principal)
    record = registry.show(version_ref(name, ref))
    bundle = VersionBundle(registry, record, Redactor(principal))
    headers = {
        "X-Normbridge-Version": record.ref,
        "X-Normbridge-Digest": bundle.digest,
        "Content-Length": str(bundle.length),
        "Content-Disposition": f'attachment; filename="{record.model}-{record.number}.tar"',
    }
    return StreamingResponse(bundle.chunks(), media_type="application/x-tar", headers=headers)
