"""The login cookie and the CSRF checks of the web pages.

The cookie holds the API token itself (the same secret a script would send as a bearer token),
HttpOnly so page scripts cannot read it, SameSite=Strict so no other site's page can make the
browser send it, Secure when the page was served over https, and it is checked against the token
table on every request, so revoking the token logs the browser out. It is never written into a
page. State-changing forms (login, logout) must come from this origin: the Origin header (or,
when a browser sends none, the Referer) must name this host, and the form must echo the
double-submit CSRF cookie set with the form.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import Response

from registry.http.auth import LOCAL_USER, Principal, principal_from_token
from registry.http.body_limits import MAX_FORM_BYTES
from registry.http.errors import ApiError
from registry.http.request_guard import parse_authority, same_origin_url

SESSION_COOKIE = "nb_session"
CSRF_COOKIE = "nb_csrf"
#: A browser session lasts at most this long (seconds); the token's revocation ends it sooner.
SESSION_MAX_AGE = 12 * 3600


def is_https(request: Request) -> bool:
    return request.url.scheme == "https"


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int | None = None) -> None:
    response.set_cookie(
        name, value, max_age=max_age, path="/", httponly=True, samesite="strict", secure=is_https(request)
    )


def clear_cookie(response: Response, request: Request, name: str) -> None:
    response.delete_cookie(name, path="/", httponly=True, samesite="strict", secure=is_https(request))


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def same_origin(request: Request) -> bool:
    """Whether the Origin header (else the Referer) names the host this request was sent to; a form needs one of them.

    The request guard already refused a foreign one; a login form also refuses a post that carries neither."""
    host = parse_authority(request.headers.get("host", ""))
    origin, referer = request.headers.get("origin"), request.headers.get("referer")
    if host is None:
        return False
    if origin is not None:
        return same_origin_url(origin, host, bare=True)
    return referer is not None and same_origin_url(referer, host)


def csrf_matches(request: Request, form: dict[str, str]) -> bool:
    """The form's csrf field equals the CSRF cookie (compared in constant time)."""
    cookie, field = request.cookies.get(CSRF_COOKIE, ""), form.get("csrf", "")
    return bool(cookie) and hmac.compare_digest(cookie.encode(), field.encode())


async def read_form(request: Request) -> dict[str, str]:
    """An application/x-www-form-urlencoded body as {field: first value} (the forms here have no files); {} for a body
    over MAX_FORM_BYTES, of which no more than that is read (the request guard refuses such a body with 413 first)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return {}
    parsed = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True, max_num_fields=20)
    return {key: values[0] for key, values in parsed.items()}


def principal_of(request: Request) -> Principal | None:
    """The viewer: from the session cookie, else the anonymous admin of --insecure-local, else None.

    A cookie whose token is unknown or revoked counts as no login (even in --insecure-local mode,
    as a bad bearer token does for the API).
    """
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        try:
            return principal_from_token(request.app.state, token)
        except ApiError:
            return None
    if getattr(request.app.state, "insecure_local", False):
        return Principal(owner=LOCAL_USER, role="admin")
    return None


def wants_html(request: Request) -> bool:
    """A browser navigation (Accept names text/html), as opposed to a script that should get a 401."""
    return "text/html" in request.headers.get("accept", "")


def safe_next(target: str | None) -> str:
    """A post-login destination on this site only (never an absolute or scheme-relative URL)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/ui/"
    return target


__all__ = [
    "CSRF_COOKIE",
    "SESSION_COOKIE",
    "clear_cookie",
    "csrf_matches",
    "is_https",
    "new_csrf_token",
    "principal_of",
    "read_form",
    "safe_next",
    "same_origin",
    "set_cookie",
    "wants_html",
]
