"""Read endpoints: models, versions, lineage, diff, aliases, audit, verify (role read, model scope enforced).

Scope is checked on the model name before the registry is asked anything, so an out-of-scope
caller gets 403 whether or not the model exists.
"""

from __future__ import annotations

from importlib import metadata as importlib_metadata
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from registry.service.results import VerifyResult

from .api_models import (
    Alias,
    AuditEntry,
    AuditHeadOut,
    AuditOut,
    Health,
    LineageView,
    ManifestDiff,
    ModelSummary,
    Version,
    VersionList,
    VerifyOut,
)
from .auth import Principal, require
from .context import error_responses, model_of, registry_for, version_ref
from .redaction import Redactor

router = APIRouter(prefix="/api/v1")
Reader = Annotated[Principal, Depends(require("read"))]
READ_ERRORS = error_responses(401, 403, 404, 409, 422, 500)


def package_version() -> str:
    try:
        return importlib_metadata.version("normbridge")
    except importlib_metadata.PackageNotFoundError:
        return "0.1.0"


@router.get("/health", response_model=Health, tags=["service"], summary="Liveness (no token needed)")
def health() -> Health:
    return Health(status="ok", version=package_version())


@router.get(
    "/models",
    response_model=list[ModelSummary],
    tags=["read"],
    responses=error_responses(401, 403, 422, 500),
    summary="Registered models with their latest version",
)
def list_models(request: Request, principal: Reader) -> list[ModelSummary]:
    rows = registry_for(request, principal).models()
    return [ModelSummary(name=n, latest=latest, versions=count) for n, latest, count in rows if principal.may_see(n)]


@router.get(
    "/models/{name}/versions",
    response_model=VersionList,
    tags=["read"],
    responses=READ_ERRORS,
    summary="Every version of a model, oldest first, and its aliases",
)
def list_versions(name: str, request: Request, principal: Reader) -> VersionList:
    principal.check("read", name)
    registry = registry_for(request, principal)
    redactor = Redactor(principal)
    return VersionList(
        versions=[Version.model_validate(redactor.version(r)) for r in registry.versions(name)],
        aliases=[Alias.model_validate(a) for a in registry.aliases(name)],
    )


@router.get(
    "/models/{name}/versions/{ref}",
    response_model=Version,
    tags=["read"],
    responses=READ_ERRORS,
    summary="One version (ref: N, an alias, or latest)",
)
def show_version(name: str, ref: str, request: Request, principal: Reader) -> Version:
    principal.check("read", name)
    return Version.model_validate(
        Redactor(principal).version(registry_for(request, principal).show(version_ref(name, ref)))
    )


@router.get(
    "/models/{name}/versions/{ref}/lineage",
    response_model=LineageView,
    tags=["read"],
    responses=READ_ERRORS,
    summary="Ancestors and descendants of a version",
)
def lineage(name: str, ref: str, request: Request, principal: Reader) -> LineageView:
    principal.check("read", name)
    return Redactor(principal).lineage(registry_for(request, principal).lineage(version_ref(name, ref)))


@router.get(
    "/models/{name}/aliases",
    response_model=list[Alias],
    tags=["read"],
    responses=READ_ERRORS,
    summary="Aliases of a model",
)
def list_aliases(name: str, request: Request, principal: Reader) -> list[Alias]:
    principal.check("read", name)
    return [Alias.model_validate(a) for a in registry_for(request, principal).aliases(name)]


@router.get(
    "/diff",
    response_model=ManifestDiff,
    tags=["read"],
    responses=READ_ERRORS,
    summary="Per-tensor and per-normalizer diff of two versions",
)
def diff(
    request: Request,
    principal: Reader,
    a: Annotated[str, Query(description="The older version, NAME@A.")],
    b: Annotated[str, Query(description="The newer version, NAME@B.")],
) -> ManifestDiff:
    principal.check("read", model_of(a))
    principal.check("read", model_of(b))
    return registry_for(request, principal).diff(a, b)


@router.post(
    "/verify",
    response_model=VerifyOut,
    tags=["read"],
    responses=READ_ERRORS,
    summary="Re-hash blobs, re-run the equivalence check, verify the audit chain",
)
def verify(
    request: Request,
    principal: Reader,
    ref: Annotated[
        str | None, Query(description="One version NAME@N; omitted: every version the token may read.")
    ] = None,
    check: Annotated[bool, Query(description="Re-run the equivalence check (false: only re-hash the blobs).")] = True,
) -> VerifyOut:
    registry = registry_for(request, principal)
    if ref is not None:
        principal.check("read", model_of(ref))
        result = registry.verify(ref, rerun_checks=check)
    elif principal.models is None:
        result = registry.verify(None, rerun_checks=check)
    else:
        result = _verify_scope(registry, principal, check)
    return VerifyOut(**result.model_dump(), passed=result.passed)


def _verify_scope(registry, principal: Principal, check: bool):
    """verify() over every version of the caller's models, merged (the audit chain is checked once)."""
    merged = {"versions": [], "blobs_checked": 0, "checks_run": 0, "audit_entries": 0, "problems": []}
    audit_seen = False
    for name, _, _ in registry.models():
        if not principal.may_see(name):
            continue
        for record in registry.versions(name):
            part = registry.verify(record.ref, rerun_checks=check)
            merged["versions"] += part.versions
            merged["blobs_checked"] += part.blobs_checked
            merged["checks_run"] += part.checks_run
            merged["audit_entries"] = part.audit_entries
            merged["problems"] += [p for p in part.problems if p.kind != "audit" or not audit_seen]
            audit_seen = True
    if not audit_seen:
        check = registry.check_audit()
        merged["audit_entries"] = check.entries
        merged["problems"] = [{"model": "-", "number": 0, "kind": "audit", "message": p} for p in check.problems]
    return VerifyResult.model_validate(merged)


@router.get(
    "/audit",
    response_model=AuditOut,
    tags=["read"],
    responses=READ_ERRORS,
    summary="The append-only audit log, oldest first",
)
def audit(
    request: Request,
    principal: Reader,
    model: Annotated[str | None, Query(description="Only entries of this model.")] = None,
    user: Annotated[str | None, Query(description="Only entries by this user.")] = None,
    verify: Annotated[
        bool, Query(description="Also verify the whole hash chain and that it ends at its head.")
    ] = False,
    expect_head: Annotated[
        str | None,
        Query(
            pattern="^[0-9a-f]{64}$",
            description=("A head hash pinned earlier: it must still be in the log (implies verify)."),
        ),
    ] = None,
) -> AuditOut:
    if model is not None:
        principal.check("read", model)
    registry = registry_for(request, principal)
    redactor = Redactor(principal)
    entries = [redactor.audit(e) for e in registry.audit(model=model, user=user) if principal.may_see(e.model)]
    check = registry.check_audit(expect_head) if verify or expect_head is not None else None
    return AuditOut(
        entries=[AuditEntry.model_validate(e) for e in entries],
        chain_ok=None if check is None else not check.problems,
        chain_problems=None if check is None else check.problems,
        head=None if check is None or check.head is None else AuditHeadOut(seq=check.head.seq, hash=check.head.hash),
    )
