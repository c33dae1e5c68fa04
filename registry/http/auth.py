"""Who is calling, and what they may do: bearer tokens, roles (read < write < admin) and model scopes.

Every router (the API here, the web pages in registry.web) depends on `require(role)`; a page
that reads a cookie calls `principal_from_token(request.app.state, value)`. Without a token the
caller is refused (401) unless the server runs with --insecure-local, where an anonymous caller
is the admin 'local' (a request that carries a token is still checked).

A state-changing /api/ request is authenticated by the request guard before its body is read (request_guard.py), which
leaves the caller in the scope under PRINCIPAL_SCOPE_KEY; `current_principal` takes it from there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Request, Security
from fastapi.security import HTTPBearer

from registry.tokens import ROLES

from .errors import forbidden, unauthorized

_RANK = {role: rank for rank, role in enumerate(ROLES)}

#: Declares the scheme in /openapi.json; the header itself is parsed in `current_principal`.
bearer_scheme = HTTPBearer(auto_error=False, description="A token from `normbridge token create`: nbt_<id>_<secret>.")

LOCAL_USER = "local"
#: Where the request guard leaves the caller it authenticated before reading the body.
PRINCIPAL_SCOPE_KEY = "normbridge.principal"


@dataclass(frozen=True)
class Principal:
    """The caller: `owner` names it in the audit log; `models` None means every model."""

    owner: str
    role: str
    models: tuple[str, ...] | None = None
    token_id: str | None = None

    def can(self, role: str, model: str | None = None) -> bool:
        """Whether the caller holds `role` (or a higher one) and, when `model` is given, may touch that model."""
        if _RANK.get(self.role, -1) < _RANK[role]:
            return False
        return model is None or self.models is None or model in self.models

    def may_see(self, model: str | None) -> bool:
        """Whether a model's entries (audit, lineage) are inside the caller's scope."""
        return self.models is None or (model is not None and model in self.models)

    def check(self, role: str, model: str | None = None) -> None:
        """Raise 403 unless `can(role, model)`."""
        if _RANK.get(self.role, -1) < _RANK[role]:
            raise forbidden(
                f"this token has role '{self.role}' but the request needs '{role}'; ask an admin for a token with role '{role}'."
            )
        if model is not None and not self.can(role, model):
            raise forbidden(
                f"this token is scoped to {', '.join(self.models or ())} and may not touch model '{model}'; use a token for that model."
            )


def principal_from_token(app_state, token: str) -> Principal:
    """The Principal a token string proves, using the app's TokenStore; raises the 401 ApiError otherwise."""
    info = app_state.tokens.authenticate(token)
    if info is None:
        raise unauthorized(
            "the token is unknown, revoked or malformed; create one with `normbridge token create` on the server host."
        )
    return Principal(owner=info.owner, role=info.role, models=info.models, token_id=info.id)


def principal_for(app_state, header: str | None) -> Principal:
    """The caller an Authorization header proves (no header: the anonymous admin under --insecure-local);
    401 otherwise."""
    if header is None:
        if getattr(app_state, "insecure_local", False):
            return Principal(owner=LOCAL_USER, role="admin")
        raise unauthorized("this request carries no token; send the header 'Authorization: Bearer <token>'.")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise unauthorized(
            "the Authorization header is not 'Bearer <token>'; send the token from `normbridge token create`."
        )
    return principal_from_token(app_state, value.strip())


def current_principal(request: Request, _declared=Security(bearer_scheme)) -> Principal:
    """The caller of this request (dependency); 401 when it cannot be established."""
    principal = request.scope.get(PRINCIPAL_SCOPE_KEY) or principal_for(
        request.app.state, request.headers.get("authorization")
    )
    request.state.principal = principal
    return principal


def require(role: str) -> Callable[..., Principal]:
    """A FastAPI dependency: the caller, who must hold at least `role` (403 otherwise).
    Model scope is checked per route."""
    if role not in _RANK:
        raise ValueError(f"role '{role}' is not one of {ROLES}")

    def dependency(request: Request, _declared=Security(bearer_scheme)) -> Principal:
        principal = current_principal(request)
        principal.check(role)
        return principal

    dependency.__name__ = f"require_{role}"
    return dependency


__all__ = [
    "LOCAL_USER",
    "PRINCIPAL_SCOPE_KEY",
    "Principal",
    "bearer_scheme",
    "current_principal",
    "principal_for",
    "principal_from_token",
    "require",
]
