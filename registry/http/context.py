"""What every route needs: the per-request Registry, reference parsing and the documented error responses."""

from __future__ import annotations

from fastapi import Request

from registry.entities import split_ref

from .api_models import ErrorResponse
from .auth import Principal

_DESCRIPTIONS = {
    400: "The uploaded file is unreadable or refused (bad_input_file).",
    401: "No token, or an unknown, revoked or malformed one (unauthorized).",
    403: "The token's role is too low or the model is outside its scope (forbidden).",
    404: "The model, version, alias or blob does not exist for this caller (not_found).",
    409: "The registry refused the operation, or the equivalence check failed (check_failed, with the report).",
    413: "The upload is larger than the server's limit (payload_too_large).",
    415: "The object is not a model normbridge can read (unsupported_object).",
    422: "The request does not match the API (invalid_request), or a spec is invalid (invalid_spec).",
    500: "Stored bytes are tampered (integrity_error) or the server failed (internal_error).",
    507: "The registry's database or blob store has no room left; nothing was stored (storage_full).",
}


def error_responses(*codes: int) -> dict:
    """OpenAPI `responses` entries with the error body for each status."""
    return {code: {"model": ErrorResponse, "description": _DESCRIPTIONS[code]} for code in codes}


def registry_for(request: Request, principal: Principal):
    """The process's Registry acting as the caller: every write it makes is audited under the token's owner."""
    return request.app.state.registry.as_user(principal.owner)


def version_ref(name: str, ref: str) -> str:
    """'NAME@ref' for a path's {ref} (a number or alias); 'latest' means the newest version."""
    return name if ref == "latest" else f"{name}@{ref}"


def model_of(ref: str) -> str:
    """The model name of 'NAME', 'NAME@N' or 'NAME@alias' (for the scope check before any lookup)."""
    return split_ref(ref)[0]
