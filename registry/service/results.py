"""What the registry's operations return: a registration, a verification, a garbage collection, an export.

Pydantic models (frozen), so the HTTP API sends them as they are and /openapi.json describes them.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field

# it lives with the records: a CLI reads one without importing this package
from ..entities import Registration  # noqa: F401


class VerifyProblem(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    number: int
    kind: str  # "blob" | "tensor" | "check" | "audit"
    tensor: str | None = None
    message: str


class VerifyResult(BaseModel):
    """Outcome of `verify`: what was re-hashed and re-checked, and every problem found."""

    model_config = ConfigDict(frozen=True)

    versions: list[str] = Field(default_factory=list)
    blobs_checked: int = 0
    checks_run: int = 0
    audit_entries: int = 0
    problems: list[VerifyProblem] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_json(self, indent: int = 2) -> str:
        return json.dumps({**self.model_dump(mode="json"), "passed": self.passed}, indent=indent)

    def render_text(self) -> str:
        lines = [
            (
                f"verified {len(self.versions)} version(s): {self.blobs_checked} blob(s) re-hashed, {self.checks_run} equivalence check(s) re-run, "
                f"{self.audit_entries} audit entries chained"
            )
        ]
        lines += [
            f"  {p.model}@{p.number} {p.kind}{' ' + p.tensor if p.tensor else ''}: {p.message}" for p in self.problems
        ]
        lines.append("verify PASSED" if self.passed else f"verify FAILED ({len(self.problems)} problem(s))")
        return "\n".join(lines)


class GcResult(BaseModel):
    """Outcome of `gc`: unreferenced blobs deleted, and those kept because they are younger than the grace period."""

    model_config = ConfigDict(frozen=True)

    deleted: list[str] = Field(default_factory=list)
    bytes_freed: int = 0
    kept_young: list[str] = Field(default_factory=list)
    kept_in_flight: list[str] = Field(
        default_factory=list,
        description=(
            "Unreferenced when gc listed them, but leased by a registration in flight (or referenced by a version committed "
            "meanwhile): kept, whatever their age."
        ),
    )
    referenced: int = 0
    grace_seconds: float = 0.0
    staging_removed: int = Field(
        default=0, description="Hidden files of registrations that crashed before publishing their blobs."
    )

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=indent)


class ExportedLayer(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    file: str
    report: str


class RegistryExport(BaseModel):
    """Outcome of `export`: one file per normalization layer, each with its conversion report."""

    model_config = ConfigDict(frozen=True)

    version: str
    to: str
    folder: str
    layers: list[ExportedLayer] = Field(default_factory=list)


__all__ = ["ExportedLayer", "GcResult", "Registration", "RegistryExport", "VerifyProblem", "VerifyResult"]
