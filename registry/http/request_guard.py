"""Refuse what a web page could forge against the server (another Host, another Origin, a form body),
and any body before it is held.

One ASGI middleware in front of the API and the web pages alike, in every mode (tokens or
--insecure-local), before any route or body is looked at, in this order:

* Host must be a name or address of this server (`HostPolicy`): the address it binds, `localhost`,
  127.0.0.1 and [::1] when that is a loopback address, every IP literal when it binds a wildcard
  (0.0.0.0, ::), and the names given with `normbridge serve --allowed-host`. A rebinding page can
  only send its own DNS name, so no name outside that list is answered, not even /api/v1/health.
* POST, PUT, PATCH and DELETE must come from this server's own pages: the Origin (else the
  Referer) must name the same host and port as Host, and Sec-Fetch-Site, when the browser sends
  it, must be same-origin or none. A request without any of them is not from a browser (the CLI
  client, scripts: every browser sends Origin on a cross-site POST) and passes on to the token check.
* A state-changing /api/ request is authenticated (auth.principal_for, the route's own rule) before a byte of its body
  is read: FastAPI reads the body of a route with a body parameter before the route's token check runs, so without
  this an anonymous caller had the server hold whatever it sent. The caller is left in the scope for the route.
* On /api/, a state-changing request's Content-Type must be absent or the one its endpoint takes: raw bytes for an
  upload, JSON everywhere else. So the bodies a form or a no-cors fetch sends without a preflight (text/plain,
  application/x-www-form-urlencoded, multipart/form-data) never reach an endpoint, and a body of the wrong type is
  refused before it is read; `body_of` says the same per route, for /openapi.json and an absent Content-Type.
* Every body but an upload's is bounded before it is read, whatever its Content-Type (body_limits.py): 32 MiB on the
  API, 8 KiB on the web pages; a larger Content-Length is refused at once, a chunked body once it passes the bound.
  Uploads stream under their own `--max-upload-mb`.

Refusals are 403 untrusted_request, 401 unauthorized, 415 unsupported_media_type and 413 payload_too_large, with the
header in the error's `setting` and the value received in its message. Every response gets X-Content-Type-Options:
nosniff.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request
from starlette.datastructures import Headers, MutableHeaders
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schemas.errors import UntrustedRequestError

from .auth import PRINCIPAL_SCOPE_KEY, principal_for
from .body_limits import API_PREFIX, MAX_JSON_BYTES, body_limit, bounded, declared_excess, is_upload
from .errors import ApiError, api_error_response, status_for, unsupported_media_type
from .responses import NOSNIFF

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON = "application/json"
#: The bodies of an upload: a model file or a bundle tar (plain or gzip), sent as raw bytes.
UPLOAD_MEDIA_TYPES = ("application/octet-stream", "application/x-tar", "application/gzip", "application/x-gzip")
#: Every body the API takes; any other Content-Type on a state-changing /api/ request is refused.
API_MEDIA_TYPES = frozenset({JSON, *UPLOAD_MEDIA_TYPES})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", "[::]", ""})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
#: Sec-Fetch-Site values of a request made by this server's own page, or typed by the user.
SAME_ORIGIN_FETCH = frozenset({"same-origin", "none"})
DEFAULT_PORTS = {"http": 80, "https": 443}
#: Environment read by app_from_env (set by `normbridge serve --workers N`): the --allowed-host values, comma-separated.
ALLOWED_HOSTS_ENV = "NORMBRIDGE_SERVE_ALLOWED_HOSTS"
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_PORT = re.compile(r"^[0-9]{1,5}$")
_SHOWN = 200  # characters of a received header value quoted in a message


@dataclass(frozen=True)
class Authority:
    """host[:port] of a Host header or an --allowed-host entry: host in lower case, an IPv6 address without brackets."""

    host: str
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    address = _ip(host.strip("[]"))
    return address is not None and address.is_loopback


def parse_authority(value: str) -> Authority | None:
    """'name', 'name:port', '10.0.0.5:80' or '[::1]:8000' as an Authority; None for anything else."""
    value = value.strip().lower()
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        address = _ip(host)
        if not bracket or address is None or address.version != 6 or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    else:
        host, colon, port_text = value.partition(":")
        port_text = port_text if colon else None
        if len(host) > 253 or not all(_LABEL.match(label) for label in host.split(".")):
            return None
    if port_text is None:
        return Authority(host)
    if not _PORT.match(port_text) or not 0 < int(port_text) < 65536:
        return None
    return Authority(host, int(port_text))


def parse_allowed_host(value: str) -> Authority:
    """An --allowed-host value (a DNS name or address, optionally with a port);
    ValueError naming the option otherwise."""
    authority = parse_authority(value)
    if authority is None or not value.strip():
        raise ValueError(
            f"--allowed-host '{value[:_SHOWN]}' is not a host name or address with an optional port; "
            "pass the name clients put in the URL, e.g. registry.example.com or registry.example.com:8443."
        )
    return authority


@dataclass(frozen=True)
class HostPolicy:
    """The Host values this server answers: `names` on any port, `authorities` on their port,
    every IP literal if `any_ip`."""

    names: frozenset[str]
    authorities: frozenset[Authority] = frozenset()
    any_ip: bool = False

    @classmethod
    def serving(cls, bind: str, allowed: Iterable[str] = ()) -> "HostPolicy":
        """The policy of a server bound to `bind` with the extra --allowed-host values `allowed`."""
        wildcard = bind.strip() in WILDCARD_BINDS
        names = set(LOOPBACK_NAMES) if wildcard or is_loopback(bind) else set()
        if not wildcard:
            names.add(bind.strip().strip("[]").lower())
        entries = [parse_allowed_host(value) for value in allowed]
        names |= {entry.host for entry in entries if entry.port is None}
        return cls(frozenset(names), frozenset(entry for entry in entries if entry.port is not None), wildcard)

    def accepts(self, authority: Authority) -> bool:
        return (
            authority.host in self.names
            or authority in self.authorities
            or (self.any_ip and _ip(authority.host) is not None)
        )


def same_origin_url(url: str, host: Authority, *, bare: bool = False) -> bool:
    """Whether `url` (an Origin when `bare`: scheme://host[:port] and nothing else; else a Referer) names host:port of
    `host`.

    A Host without a port means the default port of the URL's scheme. The scheme itself is not compared: one port
    serves one protocol, and behind a TLS proxy the server sees http while the browser's origin is https.
    """
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return False
    if (
        parts.scheme not in DEFAULT_PORTS
        or not parts.hostname
        or parts.username is not None
        or parts.password is not None
    ):
        return False
    if bare and (parts.path or parts.query or parts.fragment):
        return False
    default = DEFAULT_PORTS[parts.scheme]
    return parts.hostname == host.host and (port or default) == (host.port or default)


def _shown(value: str | None) -> str:
    return "(none)" if value is None else value[:_SHOWN]


def untrusted(header: str, message: str) -> ApiError:
    error = UntrustedRequestError(message)
    return ApiError(status_for(error), error.code, message, setting=header)


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def refusal(scope: Scope, headers: Headers, hosts: HostPolicy) -> ApiError | None:
    """Why this request is refused for where it comes from (Host, Origin: an ApiError), or None; see the module doc."""
    raw_host = headers.get("host")
    host = parse_authority(raw_host) if raw_host is not None else None
    if host is None or not hosts.accepts(host):
        return untrusted(
            "Host",
            f"this server does not answer to Host '{_shown(raw_host)}' (a page of another site reaches a local "
            "server under its own name by DNS rebinding); open the server by the address it listens on, or start "
            "it with `normbridge serve --allowed-host NAME` for the name clients use.",
        )
    if scope["method"] not in UNSAFE_METHODS:
        return None
    return _origin_refusal(scope["method"], headers, host)


def _origin_refusal(method: str, headers: Headers, host: Authority) -> ApiError | None:
    """A state-changing request sent by another site's page: Origin, else Referer,
    and Sec-Fetch-Site must say this server."""
    origin, referer, fetch_site = headers.get("origin"), headers.get("referer"), headers.get("sec-fetch-site")
    taken = "state-changing requests are taken only from this server's own pages or from clients that send no"
    if origin is not None and not same_origin_url(origin, host, bare=True):
        return untrusted(
            "Origin",
            f"this {method} comes from the page origin '{_shown(origin)}', not from this server ({host}); "
            f"{taken} Origin, such as the normbridge CLI.",
        )
    if origin is None and referer is not None and not same_origin_url(referer, host):
        return untrusted(
            "Referer",
            f"this {method} was sent from the page '{_shown(referer)}', not from this server ({host}); "
            f"{taken} Referer, such as the normbridge CLI.",
        )
    if fetch_site is not None and fetch_site.strip().lower() not in SAME_ORIGIN_FETCH:
        return untrusted(
            "Sec-Fetch-Site",
            f"the browser marked this {method} Sec-Fetch-Site '{_shown(fetch_site)}', sent by another "
            "site's page; state-changing requests are taken only from this server's own pages.",
        )
    return None


def _api_write(scope: Scope) -> bool:
    return scope["method"] in UNSAFE_METHODS and scope["path"].startswith(API_PREFIX)


def _media_refusal(scope: Scope, content_type: str | None) -> ApiError | None:
    """A state-changing /api/ request with a body its endpoint never takes (a form's, text/plain, JSON to an upload,
    ...)."""
    if not _api_write(scope) or content_type is None:
        return None
    upload = is_upload(scope)
    if media_type(content_type) in (UPLOAD_MEDIA_TYPES if upload else (JSON,)):
        return None
    takes = "raw bytes (application/octet-stream, or a tar for format=bundle)" if upload else JSON
    return unsupported_media_type(
        f"{scope['method']} {scope['path'][:_SHOWN]} takes a body of {takes}, not Content-Type "
        f"'{_shown(content_type)}'; send that, as /openapi.json says."
    )


async def _caller_refusal(scope: Scope, headers: Headers) -> ApiError | None:
    """401 for a state-changing /api/ request whose caller the route would refuse, before its body is read; otherwise
    None, with the caller left in the scope for the route (auth.current_principal)."""
    state = getattr(scope.get("app"), "state", None)
    if not _api_write(scope) or state is None or not hasattr(state, "tokens"):
        return None
    try:
        scope[PRINCIPAL_SCOPE_KEY] = await run_in_threadpool(principal_for, state, headers.get("authorization"))
    except ApiError as error:
        return error
    return None


class RequestGuard:
    """The ASGI middleware: refuse per the module doc (Host, Origin, caller, media type, declared size), else pass the
    request on with its body bounded; add nosniff to every response.

    Only HTTP requests are checked (the server serves no websockets; lifespan events pass through).
    """

    def __init__(self, app: ASGIApp, hosts: HostPolicy):
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)

        async def send_nosniff(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in NOSNIFF.items():
                    headers.setdefault(name, value)
            await send(message)

        limit = body_limit(scope)
        refused = (
            refusal(scope, headers, self.hosts)
            or await _caller_refusal(scope, headers)
            or _media_refusal(scope, headers.get("content-type"))
        )
        if refused is None and limit is not None:
            refused = declared_excess(scope, headers, limit)
        if refused is not None:  # answered without reading the body (uvicorn drops what the client still sends)
            await api_error_response(refused)(scope, receive, send_nosniff)
            return
        await self.app(scope, receive if limit is None else bounded(scope, receive, limit), send_nosniff)


def body_of(*media_types: str, optional: bool = False) -> Callable[[Request], None]:
    """A route dependency: 415 unless the body's Content-Type is one of `media_types` (or absent, when `optional`)."""

    def dependency(request: Request) -> None:
        content_type = request.headers.get("content-type")
        if content_type is None and optional:
            return
        if content_type is None or media_type(content_type) not in media_types:
            raise unsupported_media_type(
                f"{request.method} {request.url.path[:_SHOWN]} takes a body of Content-Type "
                f"{' or '.join(media_types)}, not '{_shown(content_type)}'; send one of those."
            )

    return dependency


#: What the guard adds to every operation of /openapi.json (403) and to every state-changing one (401, 413, 415).
GUARD_RESPONSES = {
    "401": "No token, or an unknown, revoked or malformed one (unauthorized), checked before the body is read.",
    "403": "The Host, Origin, Referer or Sec-Fetch-Site header does not name this server (untrusted_request).",
    "413": "The body is larger than this server takes for the endpoint: 32 MiB of JSON, or --max-upload-mb for an upload (payload_too_large).",
    "415": "The body's Content-Type is not one this endpoint takes, e.g. a form (unsupported_media_type).",
}


def declare_refusals(schema: dict) -> dict:
    """Add the guard's 403 to every operation of an OpenAPI document and its 401,
    413 and 415 to every state-changing one (in place)."""
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    for operations in schema.get("paths", {}).values():
        for method, operation in operations.items():
            statuses = ("401", "403", "413", "415") if method.upper() in UNSAFE_METHODS else ("403",)
            for status in statuses:
                declared = operation.setdefault("responses", {}).get(status)
                if declared is None:
                    operation["responses"][status] = {"description": GUARD_RESPONSES[status], "content": error}
                elif GUARD_RESPONSES[status] not in declared.get("description", ""):
                    declared["description"] = (
                        f"{declared.get('description', '').rstrip()} Or: {GUARD_RESPONSES[status]}".strip()
                    )
    return schema


__all__ = [
    "ALLOWED_HOSTS_ENV",
    "API_MEDIA_TYPES",
    "Authority",
    "HostPolicy",
    "JSON",
    "MAX_JSON_BYTES",
    "RequestGuard",
    "UPLOAD_MEDIA_TYPES",
    "body_of",
    "declare_refusals",
    "is_loopback",
    "parse_allowed_host",
    "parse_authority",
    "refusal",
    "same_origin_url",
]
