"""The result of comparing two artifact manifests: per tensor, per normalizer, and a headline."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class TensorChange(BaseModel):
    """One tensor in the comparison."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    role: str
    layer: str | None = None
    status: Literal["unchanged", "changed", "added", "removed"]
    max_abs_change: float | None = Field(default=None, description="max |b - a| (changed, same shape).")
    max_rel_change: float | None = Field(
        default=None, description="max |b - a| / max(|a|, tiny) (changed, same shape)."
    )
    detail: str | None = Field(default=None, description="e.g. a dtype or shape change.")


class ConfigChange(BaseModel):
    """One spec setting that differs between the two versions of a normalizer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    field: str
    before: Any = None
    after: Any = None


class NormalizerChange(BaseModel):
    """One normalizer: added, removed, or present in both with its config changes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    status: Literal["unchanged", "changed", "added", "removed"]
    config_changes: list[ConfigChange] = Field(default_factory=list)
    statistics_changed: bool | None = Field(
        default=False, description="None for an added or removed normalizer (nothing to compare)."
    )
    weights_changed: bool | None = Field(
        default=False, description="None for an added or removed normalizer (nothing to compare)."
    )


class ManifestDiff(BaseModel):
    """What changed from version `a` to version `b`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    a: str = Field(description="Label of the first version (its ref or content digest).")
    b: str = Field(description="Label of the second version.")
    headline: str
    identical: bool
    weights_identical: bool
    statistics_changed_layers: list[str] = Field(default_factory=list)
    config_changed_layers: list[str] = Field(default_factory=list)
    tensors: list[TensorChange] = Field(default_factory=list)
    normalizers: list[NormalizerChange] = Field(default_factory=list)
    top_level: list[ConfigChange] = Field(default_factory=list, description="framework, format or mode changes.")

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=indent)

    def render_text(self, show_unchanged: bool = False) -> str:
        lines = [f"diff {self.a} -> {self.b}: {self.headline}"]
        for change in self.top_level:
            lines.append(f"  {change.field}: {change.before!r} -> {change.after!r}")
        for normalizer in self.normalizers:
            if normalizer.status == "unchanged" and not show_unchanged:
                continue
            what = [
                label
                for flag, label in (
                    (normalizer.weights_changed, "weights"),
                    (normalizer.statistics_changed, "running statistics"),
                    (bool(normalizer.config_changes), "config"),
                )
                if flag
            ]
            lines.append(
                f"  normalizer {normalizer.path}: {normalizer.status}" + (f" ({', '.join(what)})" if what else "")
            )
            for change in normalizer.config_changes:
                lines.append(f"    config {change.field}: {change.before!r} -> {change.after!r}")
        width = max((len(t.name) for t in self.tensors), default=0)
        for tensor in self.tensors:
            if tensor.status == "unchanged" and not show_unchanged:
                continue
            line = f"  {tensor.name:<{width}}  {tensor.role:<19} {tensor.status}"
            if tensor.max_abs_change is not None:
                line += f"  max abs {tensor.max_abs_change:.3g}  max rel {tensor.max_rel_change:.3g}"
            if tensor.detail:
                line += f"  ({tensor.detail})"
            lines.append(line)
        unchanged = sum(t.status == "unchanged" for t in self.tensors)
        if unchanged and not show_unchanged:
            lines.append(f"  ({unchanged} tensors unchanged)")
        return "\n".join(lines)
