"""One error body for every failure of the HTTP API, and the handlers that produce it.

Library errors map through schemas.errors.HTTP_STATUSES (the same table as the CLI's exit codes);
HTTP-only failures (auth, size, validation) are ApiError. The body is always
{"error": {"code", "message", "layer", "setting", "report"}}; a crash never leaks a traceback.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from schemas.extras import missing_dependency
from schemas.errors import HTTP_STATUSES, CheckFailedError, NormbridgeError, NotFoundError, UnsupportedMediaTypeError

from .responses import SafeJSONResponse
from .uploads import without_workspace_paths

log = logging.getLogger("normbridge.http")


class ApiError(Exception):
    """A failure that exists only over HTTP (401, 403, 404 out of scope, 413, ...)."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None, setting: str | None = None
    ):
        super().__init__(message)
        self.status, self.code, self.message, self.headers, self.setting = status, code, message, headers, setting


def unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, {"WWW-Authenticate": "Bearer"})


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


def not_found(message: str) -> ApiError:
    return ApiError(404, "not_found", message)


def error_body(
    code: str, message: str, layer: str | None = None, setting: str | None = None, report: dict | None = None
) -> dict:
    return {"error": {"code": code, "message": message, "layer": layer, "setting": setting, "report": report}}


def status_for(error: NormbridgeError) -> int:
    """The most specific HTTP status of HTTP_STATUSES for an error."""
    for cls in type(error).__mro__:
        if cls in HTTP_STATUSES:
            return HTTP_STATUSES[cls]
    return 500


def _library_error(request: Request, error: NormbridgeError) -> SafeJSONResponse:
    message = without_workspace_paths(error.message)
    principal = getattr(request.state, "principal", None)
    if isinstance(error, NotFoundError) and principal is not None and principal.models is not None:
        # NotFound messages list the registry's models; a scoped caller must not learn the others' names.
        message = "the model, version or alias asked for does not exist in the models this token may read."
    report = None
    if isinstance(error, CheckFailedError) and error.result is not None:
        report = error.result.model_dump(mode="json")  # inf/NaN errors (an overflowing layer) are sent as null
    return SafeJSONResponse(
        error_body(error.code, message, error.layer, error.setting, report), status_code=status_for(error)
    )


def unsupported_media_type(message: str) -> ApiError:
    return ApiError(
        status_for(UnsupportedMediaTypeError(message)), UnsupportedMediaTypeError.code, message, setting="Content-Type"
    )


def api_error_response(error: ApiError) -> SafeJSONResponse:
    return SafeJSONResponse(
        error_body(error.code, error.message, setting=error.setting), status_code=error.status, headers=error.headers
    )


def _api_error(request: Request, error: ApiError) -> SafeJSONResponse:
    return api_error_response(error)


def _validation_error(request: Request, error: RequestValidationError) -> SafeJSONResponse:
    problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in error.errors()[:5])
    return SafeJSONResponse(
        error_body("invalid_request", f"the request does not match the API ({problems}); see /openapi.json."),
        status_code=422,
    )


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large", 415: "unsupported_media_type"}


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (Starlette's own Allow names only the first route's)."""
    methods = [
        m
        for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
        if any(route.matches({**request.scope, "method": m})[0] == Match.FULL for route in request.app.routes)
    ]
    return ", ".join(methods)


def _http_error(request: Request, error: StarletteHTTPException) -> SafeJSONResponse:
    status, headers = error.status_code, dict(getattr(error, "headers", None) or {})
    message = error.detail if isinstance(error.detail, str) else str(error.detail)
    if status == 400:  # FastAPI's "error parsing the body": a malformed request, reported like any other
        return SafeJSONResponse(
            error_body(
                "invalid_request", f"the request body could not be parsed ({message}); send the JSON of the API."
            ),
            status_code=422,
        )
    if status == 404 and message == "Not Found":
        message = f"no endpoint at {request.url.path}; see /openapi.json for the API."
    if status == 405:
        headers["Allow"] = _allowed_methods(request)
        message = f"{request.method} is not served at {request.url.path}; allowed: {headers['Allow']}."
    return SafeJSONResponse(
        error_body(_HTTP_CODES.get(status, "http_error"), message, setting=getattr(error, "setting", None)),
        status_code=status,
        headers=headers or None,
    )


def _missing_module(request: Request, error: ModuleNotFoundError) -> SafeJSONResponse:
    """An optional package the request needs is not installed on the server: 501 naming the extra, not a crash."""
    missing = missing_dependency(error)
    return _crash(request, error) if missing is None else _library_error(request, missing)


def _crash(request: Request, error: Exception) -> SafeJSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return SafeJSONResponse(
        error_body("internal_error", "the server failed unexpectedly; the server log has the details."), status_code=500
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(NormbridgeError, _library_error)
    app.add_exception_handler(ModuleNotFoundError, _missing_module)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _crash)


__all__ = [
    "ApiError",
    "api_error_response",
    "error_body",
    "forbidden",
    "install_error_handlers",
    "not_found",
    "status_for",
    "unauthorized",
    "unsupported_media_type",
]
