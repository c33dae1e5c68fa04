"""Pydantic models of every JSON body the API sends or accepts, so /openapi.json describes it exactly.

Records (frozen dataclasses of registry/entities.py) become these models with `from_attributes`;
results that already are pydantic models (CheckResult, ManifestDiff, LineageView, GcResult) are reused.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from registry.drift_records import DriftRecord
from schemas.monitoring import DriftHistory
from registry.entities import AuditRecord
from registry.lineage import LineageView
from registry.service.results import GcResult, VerifyProblem
from registry.service.servable import VersionHazard
from schemas.check_result import CheckResult
from schemas.manifest import UnrecognisedLayer
from schemas.manifest_diff import ManifestDiff


class _Record(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class Health(BaseModel):
    status: str = Field(examples=["ok"])
    version: str = Field(examples=["0.1.0"])


class ModelSummary(BaseModel):
    name: str
    latest: int
    versions: int


class Version(_Record):
    model: str
    number: int
    digest: str = Field(description="sha256 of the whole manifest (the artifact digest).")
    content_digest: str = Field(description="sha256 of what the model computes (identical content = same version).")
    manifest: dict[str, Any]
    parent: str | None = Field(description="'name@N' of the parent version, if any.")
    operation: str
    note: str | None
    created_at: datetime
    user: str
    servable: bool | None = Field(
        default=None,
        description=(
            "Whether the version may serve: false when a hazard blocks (train mode, statistics that never saw data, an eps that "
            "rounds to 0 in the layer's dtype, normalization the equivalence check did not cover). A guarded alias (production) "
            "refuses a version that is not servable unless forced."
        ),
    )
    hazards: list[VersionHazard] = Field(
        default_factory=list,
        description="The warning- and error-level hazards found at registration; "
        "the blocking ones are the reasons it is not servable.",
    )
    structure_checked: bool | None = Field(
        default=None,
        description=(
            "True when a safe reader accepted the version's stored structure at registration (its model file is rebuilt on "
            "pull without being read back); null for a version registered before this was recorded, or with no structure."
        ),
    )


class Alias(_Record):
    model: str
    alias: str
    number: int
    moved_at: datetime
    user: str


#: The audit entry as the API sends it: AuditRecord's own fields (one declaration of an audit entry,
#: registry/entities.py).
AuditEntry = create_model(
    "AuditEntry", __base__=_Record, **{name: (kind, ...) for name, kind in get_type_hints(AuditRecord).items()}
)


class VersionList(BaseModel):
    versions: list[Version]
    aliases: list[Alias]


class Registered(BaseModel):
    created: bool = Field(
        description="False when identical content was already registered (the existing version is returned)."
    )
    version: Version
    checks: list[CheckResult]
    unrecognised: list[UnrecognisedLayer] = Field(
        default_factory=list,
        description="Layers that look like normalizations and that no recognizer proved, registered unchecked "
        "because allow_unrecognised was given (a model with weights and no normalization found is one entry, '<model>').",
    )


class AliasBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str | int = Field(description="The version it points at: 'NAME@N' or N.", examples=["resnet@2", 2])


class VerifyOut(BaseModel):
    """VerifyResult plus its verdict."""

    versions: list[str]
    blobs_checked: int
    checks_run: int
    audit_entries: int
    problems: list[VerifyProblem]
    passed: bool


class AuditHeadOut(BaseModel):
    seq: int = Field(description="The last entry's sequence number (0 for an empty log).")
    hash: str = Field(description="The last entry's hash: pin it, and pass it back as expect_head.")


class AuditOut(BaseModel):
    entries: list[AuditEntry]
    chain_ok: bool | None = Field(
        description="Whether the whole hash chain is intact and ends at its head (null unless verify=true)."
    )
    chain_problems: list[str] | None
    head: AuditHeadOut | None = Field(
        default=None,
        description="The head the chain was verified against (null unless verify=true, or if the head row is missing).",
    )


class DriftList(DriftHistory):
    """A version's drift history (windows from serving collectors, newest first, and the state they move) and its
    recorded offline checks, which never move the state (the newest is summarised in `offline`)."""

    reports: list[DriftRecord] = Field(
        description="Offline checks recorded with `normbridge drift --record`, newest first."
    )


MAX_DIGESTS = 100_000


class DigestList(BaseModel):
    """Blob digests (the request of POST /api/v1/blobs/present)."""

    model_config = ConfigDict(extra="forbid")
    digests: list[str] = Field(
        max_length=MAX_DIGESTS, description="sha256 hex digests of blobs, e.g. every blob of a manifest."
    )


class PresentBlobs(BaseModel):
    present: list[str] = Field(
        description="The asked digests the server stores and a version of a model this token may read "
        "references: a bundle uploaded with this token may leave them out."
    )


class ErrorDetail(BaseModel):
    code: str = Field(
        description="Stable machine-readable name, e.g. unauthorized, forbidden, not_found, check_failed."
    )
    message: str
    layer: str | None = None
    setting: str | None = None
    report: CheckResult | None = Field(
        default=None, description="The failed equivalence check (code check_failed only)."
    )


class ErrorResponse(BaseModel):
    error: ErrorDetail


__all__ = [
    "Alias",
    "AliasBody",
    "AuditEntry",
    "AuditHeadOut",
    "AuditOut",
    "CheckResult",
    "DriftList",
    "DriftRecord",
    "ErrorResponse",
    "GcResult",
    "Health",
    "LineageView",
    "ManifestDiff",
    "ModelSummary",
    "Registered",
    "Version",
    "VersionList",
    "VerifyOut",
]
