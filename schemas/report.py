"""The fidelity report: what every conversion did to every setting of every layer."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: exact: carried unchanged; translated: re-expressed in the target's convention without loss;
#: stored: kept outside the target's native fields (metadata, attribute); approximate: a faithful
#: alternative with a stated difference; dropped: the target cannot hold it.
Fate = Literal["exact", "translated", "stored", "approximate", "dropped"]


class Translation(BaseModel):
    """One setting of one layer: its value before and after, and how it was carried."""

    model_config = ConfigDict(extra="forbid")

    setting: str
    source_value: Any = None
    target_value: Any = None
    fate: Fate = "exact"
    note: str = ""


class LayerReport(BaseModel):
    """Everything one conversion of one layer did."""

    model_config = ConfigDict(extra="forbid")

    layer: str
    kind: str
    source_framework: str
    target_framework: str
    target_op: str = Field(description="Class or op the target uses, e.g. BatchNormalization-15 or a decomposition.")
    native: bool = Field(default=True, description="The target uses its own normalization op, not a decomposition.")
    translations: list[Translation] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)

    def add(
        self, setting: str, source_value: Any, target_value: Any = None, fate: Fate = "exact", note: str = ""
    ) -> None:
        """Record one setting's translation (target_value defaults to the source value)."""
        if target_value is None and fate == "exact":
            target_value = source_value
        self.translations.append(
            Translation(setting=setting, source_value=source_value, target_value=target_value, fate=fate, note=note)
        )

    def warn(self, message: str) -> None:
        """Record a warning the user must read (an approximation, a dropped setting)."""
        if message not in self.warnings:
            self.warnings.append(message)


class ConversionReport(BaseModel):
    """Per-layer fidelity report of one conversion call; renders as text and JSON."""

    model_config = ConfigDict(extra="forbid")

    layers: list[LayerReport] = Field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        return [f"{layer.layer}: {w}" for layer in self.layers for w in layer.warnings]

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=indent, default=str)

    def render_text(self) -> str:
        """Plain-text rendering, one block per layer, one line per setting."""
        lines: list[str] = []
        for layer in self.layers:
            op = layer.target_op + ("" if layer.native else " (decomposed)")
            lines.append(f"{layer.layer} [{layer.kind}] {layer.source_framework} -> {layer.target_framework}: {op}")
            for t in layer.translations:
                arrow = f"{t.source_value!r}" if t.fate == "exact" else f"{t.source_value!r} -> {t.target_value!r}"
                note = f"  ({t.note})" if t.note else ""
                lines.append(f"  {t.setting:<22} {t.fate:<11} {arrow}{note}")
            for warning in layer.warnings:
                lines.append(f"  WARNING: {warning}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render_text()
