"""The web pages of `normbridge serve`: server-rendered HTML under /ui, same tokens as the API.

Routes only gather data (pages.py) and render a template; every page checks the viewer's
session (session.py) and the model scope of what it shows, exactly as the API's routes do.
Failures render an HTML error page with the API's status code. No JavaScript: the pictures are
inline SVG, so the pages load with one request each.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from registry import drift_history
from registry.drift_records import drift_reports
from registry.http.auth import Principal, principal_from_token
from registry.http.errors import ApiError, error_body, status_for
from registry.http.redaction import Redactor
from registry.entities import split_ref
from schemas.errors import NormbridgeError
from schemas.hazard_groups import SHOWN_LAYERS

from . import drift_view, pages
from .session import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    SESSION_MAX_AGE,
    clear_cookie,
    csrf_matches,
    new_csrf_token,
    principal_of,
    read_form,
    safe_next,
    same_origin,
    set_cookie,
    wants_html,
)

router = APIRouter(include_in_schema=False)

templates = Environment(
    loader=PackageLoader("registry.web", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.globals["version_url"] = pages.version_url
templates.globals["outcome_classes"] = pages.OUTCOME_CLASSES

#: No scripts at all; styles are inline in the page; forms post only to this origin; never framed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
#: The models page lists this many newest versions per model (the model's page lists all).
MODELS_PAGE_VERSIONS = 10
#: The drift page plots this many newest serving windows.
DRIFT_PAGE_WINDOWS = 100
#: The audit page shows at most this many entries (newest first).
MAX_AUDIT_ROWS = 1000


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    principal = getattr(request.state, "web_principal", None)
    csrf = request.cookies.get(CSRF_COOKIE) or new_csrf_token()
    html = templates.get_template(name).render(
        principal=principal, logged_in=bool(request.cookies.get(SESSION_COOKIE)), csrf=csrf, **context
    )
    response = HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)
    if request.cookies.get(CSRF_COOKIE) != csrf:
        set_cookie(response, request, CSRF_COOKIE, csrf)
    return response


def _login_redirect(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(
        f"/ui/login?next={quote(target, safe='')}", status_code=303, headers={"Cache-Control": "no-store"}
    )


def page(handler: Callable) -> Callable:
    """A page handler that needs a logged-in viewer with role read; errors become HTML error pages.

    Without a valid session: a browser is sent to the login page, anything else gets the API's 401.
    """

    @wraps(handler)
    def wrapper(request: Request, *args, **kwargs):
        principal = principal_of(request)
        if principal is None:
            if wants_html(request):
                return _login_redirect(request)
            return JSONResponse(
                error_body("unauthorized", "log in at /ui/login (or send a bearer token to /api/v1)."),
                status_code=401,
                headers={"WWW-Authenticate": "Bearer", "Cache-Control": "no-store"},
            )
        request.state.web_principal = principal
        try:
            principal.check("read")
            return handler(request, principal, *args, **kwargs)
        except ApiError as error:
            return render(
                request,
                "error.html",
                error.status,
                status=error.status,
                code=error.code,
                message=error.message,
                title="Not allowed" if error.status == 403 else "Error",
            )
        except NormbridgeError as error:
            status = status_for(error)
            return render(
                request,
                "error.html",
                status,
                status=status,
                code=error.code,
                message=str(error),
                title="Not found" if status == 404 else "The registry refused this",
            )

    # FastAPI reads the parameters from the signature: the viewer is supplied here, not by the request.
    signature = inspect.signature(handler)
    wrapper.__signature__ = signature.replace(
        parameters=[p for n, p in signature.parameters.items() if n != "principal"]
    )
    return wrapper


def _check_ref(principal: Principal, ref: str) -> None:
    principal.check("read", split_ref(ref)[0])


def _ref(name: str, ref: str) -> str:
    return name if ref == "latest" else f"{name}@{ref}"


def _registry(request: Request, principal: Principal):
    return request.app.state.registry.as_user(principal.owner)


def _shown(request: Request, principal: Principal, name: str, ref: str):
    """(registry, record) of NAME@REF, after checking the principal may read NAME."""
    principal.check("read", name)
    registry = _registry(request, principal)
    return registry, registry.show(_ref(name, ref))


# --------------------------------------------------------------------------- login / logout


@router.get("/", response_class=HTMLResponse)
def root() -> Response:
    return RedirectResponse("/ui/", status_code=303)


@router.get("/ui/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/ui/") -> HTMLResponse:
    request.state.web_principal = None
    return render(request, "login.html", next=safe_next(next), error=None)


@router.post("/ui/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """Check the token like the API would, then keep it in the session cookie (never echoed into a page)."""
    request.state.web_principal = None
    form = await read_form(request)
    target = safe_next(form.get("next"))
    if not same_origin(request) or not csrf_matches(request, form):
        return render(
            request,
            "login.html",
            403,
            next=target,
            error="The login form must be sent from this site's own login page; reload it and try again.",
        )
    try:
        principal_from_token(request.app.state, form.get("token", "").strip())
    except ApiError:
        return render(request, "login.html", 401, next=target, error="That token is unknown, revoked or malformed.")
    response = RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})
    set_cookie(response, request, SESSION_COOKIE, form["token"].strip(), max_age=SESSION_MAX_AGE)
    set_cookie(response, request, CSRF_COOKIE, new_csrf_token())  # a fresh CSRF secret per session
    return response


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    form = await read_form(request)
    if not same_origin(request) or not csrf_matches(request, form):
        return JSONResponse(error_body("forbidden", "logout must be posted from this site's pages."), status_code=403)
    response = RedirectResponse("/ui/login", status_code=303, headers={"Cache-Control": "no-store"})
    clear_cookie(response, request, SESSION_COOKIE)
    clear_cookie(response, request, CSRF_COOKIE)
    return response


# --------------------------------------------------------------------------- pages


@router.get("/ui/", response_class=HTMLResponse)
@page
def models_page(request: Request, principal: Principal) -> HTMLResponse:
    registry, redactor = _registry(request, principal), Redactor(principal)
    models = [
        pages.model_rows(registry, name, redactor, limit=MODELS_PAGE_VERSIONS)
        for name, _, _ in registry.models()
        if principal.may_see(name)
    ]
    return render(request, "models.html", models=models, drift_states=drift_view.drift_states(registry))


@router.get("/ui/models/{name}", response_class=HTMLResponse)
@page
def model_page(request: Request, principal: Principal, name: str) -> HTMLResponse:
    principal.check("read", name)
    registry = _registry(request, principal)
    return render(
        request,
        "model.html",
        model=pages.model_rows(registry, name, Redactor(principal)),
        drift_states=drift_view.drift_states(registry),
    )


@router.get("/ui/models/{name}/versions/{ref}", response_class=HTMLResponse)
@page
def version_page(request: Request, principal: Principal, name: str, ref: str) -> HTMLResponse:
    registry, record = _shown(request, principal, name, ref)
    redactor = Redactor(principal)
    record = redactor.version(record)
    manifest = registry.manifest(record.ref)
    badges = sorted(a.alias for a in registry.aliases(record.model) if a.number == record.number)
    if record.number == max(r.number for r in registry.versions(record.model)):
        badges = ["latest", *badges]
    parent_visible = record.parent is not None and not redactor.is_hidden(record.parent)
    return render(
        request,
        "version.html",
        record=record,
        manifest=manifest,
        aliases=badges,
        verdict=pages.verdict(record),
        drift_state=drift_view.drift_states(registry).get((record.model, record.number)),
        layers=pages.layer_rows(registry, record),
        equivalence=pages.equivalence_rows(record),
        model_url=pages.model_url(record.model),
        serving=pages.serving_rows(record),
        shown_layers=SHOWN_LAYERS,
        lineage_url=pages.version_url(record.model, record.number) + "/lineage",
        drift_url=pages.version_url(record.model, record.number) + "/drift",
        parent_url=pages.version_url(*pages.split(record.parent)) if parent_visible else None,
        diff_parent_url=pages.diff_url(record.parent, record.ref) if parent_visible else None,
    )


@router.get("/ui/models/{name}/versions/{ref}/lineage", response_class=HTMLResponse)
@page
def lineage_page(request: Request, principal: Principal, name: str, ref: str) -> HTMLResponse:
    registry, record = _shown(request, principal, name, ref)
    redactor = Redactor(principal)
    svg, rows, not_drawn = pages.lineage_graph(redactor.lineage(registry.lineage(record.ref)), redactor)
    return render(
        request,
        "lineage.html",
        record=record,
        svg=svg,
        rows=rows,
        not_drawn=not_drawn,
        version_url=pages.version_url(record.model, record.number),
        model_url=pages.model_url(record.model),
    )


@router.get("/ui/diff", response_class=HTMLResponse)
@page
def diff_page(request: Request, principal: Principal, a: str, b: str) -> HTMLResponse:
    _check_ref(principal, a)
    _check_ref(principal, b)
    registry = _registry(request, principal)
    record_a, record_b = registry.show(a), registry.show(b)
    diff = registry.diff(record_a.ref, record_b.ref)
    return render(
        request,
        "diff.html",
        diff=diff,
        plot=pages.movement_plot(registry, record_a, record_b, diff),
        a_url=pages.version_url(record_a.model, record_a.number),
        b_url=pages.version_url(record_b.model, record_b.number),
    )


@router.get("/ui/models/{name}/versions/{ref}/drift", response_class=HTMLResponse)
@page
def drift_page(request: Request, principal: Principal, name: str, ref: str) -> HTMLResponse:
    registry, record = _shown(request, principal, name, ref)
    reports = drift_reports(registry, record.ref)
    latest = reports[0] if reports else None
    served = drift_history.history(registry, record.ref, limit=DRIFT_PAGE_WINDOWS)
    shift_chart, ratio_chart = pages.drift_charts(latest.report) if latest else ("", "")
    recalibrated = [
        {"ref": node.ref, "note": node.note, "url": pages.version_url(*node.ref.rsplit("@", 1))}
        for node in registry.lineage(record.ref).nodes
        if node.parent == record.ref and node.operation == "recalibrated" and principal.may_see(split_ref(node.ref)[0])
    ]
    return render(
        request,
        "drift.html",
        record=record,
        latest=latest,
        older=reports[1:],
        shift_chart=shift_chart,
        ratio_chart=ratio_chart,
        served=served,
        history=served if served.windows else None,
        log_ratio_factor=math.exp(served.rule.log_ratio),
        faults=drift_view.fault_banner(served),
        offline_class=drift_view.STATES.get(served.offline.verdict, "ok") if served.offline else None,
        timeline=drift_view.window_timeline(served) if served.windows else drift_view.shift_timeline(reports),
        state=drift_view.report_state(latest.report) if latest else None,
        ratio_factor=math.exp(latest.report.thresholds.log_ratio) if latest else None,
        recalibrated=recalibrated,
        version_url=pages.version_url(record.model, record.number),
    )


@router.get("/ui/audit", response_class=HTMLResponse)
@page
def audit_page(request: Request, principal: Principal, model: str = "", user: str = "") -> HTMLResponse:
    if model:
        principal.check("read", model)
    registry = _registry(request, principal)
    log, check = registry.verified_audit()  # the whole log and its head, read once
    problems = check.problems
    redactor = Redactor(principal)
    every = [redactor.audit(e) for e in log if principal.may_see(e.model)]
    entries = [e for e in every if (not model or e.model == model) and (not user or e.user == user)]
    entries.reverse()
    return render(
        request,
        "audit.html",
        entries=entries[:MAX_AUDIT_ROWS],
        model=model,
        user=user,
        model_names=sorted(
            {name for name, _, _ in registry.models() if principal.may_see(name)} | ({model} if model else set())
        ),
        user_names=sorted({e.user for e in every} | ({user} if user else set())),
        chain_ok=not problems,
        chain_problems=problems if principal.models is None else [],
    )


__all__ = ["router", "templates"]
