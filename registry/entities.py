"""The records the registry hands out, and how a reference to a version is parsed.

As `mlflow/entities` sits below both the database rows and the store that returns them, these
frozen dataclasses sit below registry/db/models.py (whose rows build them with `to_record()`),
registry/metadata.py (which returns them) and the HTTP models (which validate them), so none of
those import each other to name a record. Times are timezone-aware UTC.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from schemas.errors import InvalidReferenceError

#: What a model name and an alias may be.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class VersionRecord:
    """One immutable version of a model: its artifact digest, manifest, lineage and servable verdict.

    `servable` is None only for a version registered before the verdict existed and not yet assessed; `hazards` are the
    warning- and error-level hazards found in it, each a dict with layer, code, severity, message and blocking.
    `structure_checked` is True when a safe reader accepted its stored structure at registration (so `pull` need not
    read the rebuilt file back), None for a version registered before that was recorded.
    """

    model: str
    number: int
    digest: str
    content_digest: str
    manifest: dict
    parent: str | None  # "name@N"
    operation: str
    note: str | None
    created_at: datetime
    user: str
    servable: bool | None = None
    hazards: list[dict[str, Any]] = field(default_factory=list)
    structure_checked: bool | None = None

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.number}"


@dataclass(frozen=True)
class Registration:
    """What `register` did: the version (new, or the existing one with identical content) and the checks it passed."""

    version: VersionRecord
    created: bool
    checks: list = field(default_factory=list)  # list[schemas.CheckResult]
    unrecognised: list = field(
        default_factory=list
    )  # list[schemas.manifest.UnrecognisedLayer]: registered unchecked, by request
    #: Where the registration's time went, wall seconds per step (reading, gate, staging, commit): a local registration
    #: measures them (in the shared worker when it ran there); a server's answer carries none.
    seconds: dict = field(default_factory=dict)


@dataclass(frozen=True)
class AliasRecord:
    """Where `model@alias` points (or pointed, in the alias history)."""

    model: str
    alias: str
    number: int
    moved_at: datetime
    user: str


@dataclass(frozen=True)
class AuditRecord:
    """One entry of the hash-chained audit log (registry/audit_chain.py says what its hash covers)."""

    seq: int
    at: datetime
    user: str
    action: str
    model: str | None
    number: int | None
    detail: dict[str, Any]
    prev_hash: str
    hash: str


def split_ref(ref: str) -> tuple[str, str | None]:
    """'name@N' / 'name@alias' / 'name' -> (name, suffix or None); 'name@latest' is 'name' (no alias may be called
    latest), as in the HTTP API's paths."""
    name, at, suffix = ref.rpartition("@")
    if not at:
        name, suffix = ref, None
    if not NAME.match(name) or (at and not NAME.match(suffix)):
        raise InvalidReferenceError(
            f"reference {ref!r} is malformed; expected 'NAME', 'NAME@N', 'NAME@ALIAS' or 'NAME@latest' "
            "(names of letters, digits, '.', '_' and '-')"
        )
    return name, None if suffix == "latest" else suffix


__all__ = ["AliasRecord", "AuditRecord", "NAME", "Registration", "VersionRecord", "split_ref"]
