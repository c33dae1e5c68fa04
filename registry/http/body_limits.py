"""Every request body but an upload's is bounded before it is read: the API's JSON at MAX_JSON_BYTES,
a page's form at MAX_FORM_BYTES.

FastAPI reads the body of a route that has a body parameter before any of the route's dependencies (token, media type,
size) runs, so the bound sits in front of the app, in the ASGI layer (request_guard.RequestGuard applies it, whatever
the Content-Type, or none): a declared Content-Length over the bound is refused before a byte is read
(`declared_excess`), and a body without one is cut as soon as the bytes received pass it (`bounded`: the 413 is raised
from `receive`, while the app reads). Uploads (POST /api/v1/models/{name}/versions) are not bounded here: they stream to
a file or to the bundle reader under their own limit, `normbridge serve --max-upload-mb` (uploads.py, body_pipe.py).
"""

from __future__ import annotations

import re

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import Message, Receive, Scope

from schemas.errors import PayloadTooLargeError

from .errors import ApiError, status_for

API_PREFIX = "/api/"
#: The largest JSON body the API parses (bytes): a drift window of ResNet-50's 53 BatchNorms is about 2 MB.
MAX_JSON_BYTES = 32 * 1024**2
#: The largest form body the web pages read (bytes): the login form is a token and a few short fields.
MAX_FORM_BYTES = 8192
_UPLOAD_PATH = re.compile(r"^/api/v1/models/[^/]+/versions/?$")


def is_upload(scope: Scope) -> bool:
    """Whether the request is a registration upload (its body is bounded by --max-upload-mb as it streams, not here)."""
    return scope["method"] == "POST" and _UPLOAD_PATH.match(scope["path"]) is not None


def body_limit(scope: Scope) -> int | None:
    """The bytes this request's body may hold; None for an upload."""
    if is_upload(scope):
        return None
    return MAX_JSON_BYTES if scope["path"].startswith(API_PREFIX) else MAX_FORM_BYTES


def _message(scope: Scope, limit: int, size: int | None) -> str:
    what = (
        "a JSON request; send less per request"
        if scope["path"].startswith(API_PREFIX)
        else "a form; send the page's own form"
    )
    received = "larger than" if size is None else f"{size} bytes, over"
    return f"the request body is {received} this server's limit of {limit} bytes for {what}."


class BodyTooLarge(HTTPException):
    """Raised from `receive` once a body passes its bound. An HTTPException, because FastAPI passes those on unchanged
    from reading a body (it turns any other error there into a 400) and the app's handler answers it
    (errors.py: 413)."""

    def __init__(self, message: str):
        super().__init__(413, detail=message)
        self.setting = "Content-Length"


def declared_excess(scope: Scope, headers: Headers, limit: int) -> ApiError | None:
    """The 413 of a body whose declared Content-Length is over `limit`, answered before any of it is read; else None."""
    declared = headers.get("content-length", "")
    if not declared.isdigit() or int(declared) <= limit:
        return None
    error = PayloadTooLargeError(_message(scope, limit, int(declared)))
    return ApiError(status_for(error), error.code, str(error), setting="Content-Length")


def bounded(scope: Scope, receive: Receive, limit: int) -> Receive:
    """`receive` counting the body's bytes: BodyTooLarge once they pass `limit`, so no more than that is ever held."""
    seen = 0

    async def receive_bounded() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(_message(scope, limit, None))
        return message

    return receive_bounded


__all__ = [
    "API_PREFIX",
    "BodyTooLarge",
    "MAX_FORM_BYTES",
    "MAX_JSON_BYTES",
    "body_limit",
    "bounded",
    "declared_excess",
    "is_upload",
]
