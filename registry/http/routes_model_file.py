"""The runnable model of a version: GET /api/v1/models/{name}/versions/{ref}/model?format=...
(role read, model scope enforced).

The server rebuilds the file (registry/service/model_files.py: blobs re-hashed as they are read, a structure a safe
reader accepted at registration, or, for a version registered before that was recorded, the file read back through the
framework's safe reader) into an unnamed temporary file, and streams it from there a chunk at a time with its sha256 in
X-Normbridge-Digest, which the client checks before it writes anything: a client that reads slowly, or never, holds a
chunk of the server's memory, not the file. Scope is checked on the model name first, so an out-of-scope caller gets
403 whether or not the model exists.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from registry.service.model_files import PULL_FORMATS

from .auth import Principal, require
from .context import error_responses, registry_for, version_ref

router = APIRouter(prefix="/api/v1")
PullFormat = Literal[PULL_FORMATS]  # validated by FastAPI: an unknown format is a 422 naming the ones there are
Reader = Annotated[Principal, Depends(require("read"))]
#: Bytes read from the temporary file per send: what a stalled client pins (with the socket's buffers) until it reads.
CHUNK = 256 * 1024
HEADERS = {
    "X-Normbridge-Version": {"description": "NAME@N", "schema": {"type": "string"}},
    "X-Normbridge-Digest": {"description": "sha256 hex of the file sent.", "schema": {"type": "string"}},
    "X-Normbridge-Format": {
        "description": f"{', '.join(PULL_FORMATS[1:-1])} or {PULL_FORMATS[-1]}.",
        "schema": {"type": "string"},
    },
}


@router.get(
    "/models/{name}/versions/{ref}/model",
    tags=["read"],
    response_class=StreamingResponse,
    summary="The version as a runnable model file (its source format) or its state dict as safetensors",
    responses={
        200: {
            "description": "The file's bytes.",
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            "headers": HEADERS,
        },
        **error_responses(401, 403, 404, 409, 422, 500),
    },
)
def get_model_file(
    name: str,
    ref: str,
    request: Request,
    principal: Reader,
    format: Annotated[
        PullFormat, Query(description=f"One of {', '.join(PULL_FORMATS)}; source: the format it was registered in.")
    ] = "source",
) -> StreamingResponse:
    principal.check("read", name)
    file = registry_for(request, principal).spooled_model_file(version_ref(name, ref), format)
    filename = f"{file.ref.replace('@', '-')}{file.suffix}"
    headers = {
        "X-Normbridge-Version": file.ref,
        "X-Normbridge-Digest": file.sha256,
        "X-Normbridge-Format": file.format,
        "Content-Length": str(file.nbytes),
        "Content-Disposition": f'attachment; filename="{filename}"',
    }
    return StreamingResponse(file.chunks(CHUNK), media_type="application/octet-stream", headers=headers)
