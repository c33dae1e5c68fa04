"""The result of inspecting a whole model: every normalization layer, its state and its hazards.

A hazard is a fact about a layer (or the model) that changes what the model computes at
serving time, or hides it: a layer left in train mode, statistics never updated, an eps that
is not the framework's default, a BatchNorm folded away. Severities say what to do:
`error` means the outputs depend on the batch (fix before serving), `warning` that the state
is suspicious or can no longer be checked, `info` that a setting is unusual but may be right.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .hazard_groups import group_hazards

Severity = Literal["error", "warning", "info"]
#: Order of severities, for `--fail-on` and sorting.
SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "error": 2}

#: train/eval where the layer's output depends on a mode flag (BatchNorm, tracked InstanceNorm);
#: n/a where it does not (LayerNorm, RMSNorm, GroupNorm, untracked InstanceNorm) and for Keras,
#: whose mode is chosen per call (`training=...`), not stored on the layer.
Mode = Literal["train", "eval", "n/a"]

#: Where the layer was found: a torch.nn.Module, a torch.export ExportedProgram, a Keras model,
#: or an ONNX graph (a native op, or a decomposition in the style of torch.onnx, tf2onnx or normbridge).
Origin = Literal["module", "exported_program", "keras", "native", "torch.onnx", "tf2onnx", "normbridge"]


class StatsSummary(BaseModel):
    """min/mean/max of the running statistics, and whether they ever moved from their initial values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mean_min: float
    mean_mean: float
    mean_max: float
    var_min: float
    var_mean: float
    var_max: float
    num_batches_tracked: int | None = Field(
        default=None, description="Batches seen, where the framework counts them (PyTorch)."
    )
    updated: bool = Field(
        description="The statistics moved from mean 0 / var 1 (and num_batches_tracked > 0 where it exists)."
    )

    def render_text(self) -> str:
        count = "" if self.num_batches_tracked is None else f" n={self.num_batches_tracked}"
        return (
            f"mean {self.mean_min:.3g}/{self.mean_mean:.3g}/{self.mean_max:.3g} "
            f"var {self.var_min:.3g}/{self.var_mean:.3g}/{self.var_max:.3g}{count}"
        )


class Hazard(BaseModel):
    """One problem found in a layer or a model; `code` is stable (scripts match on it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str
    severity: Severity
    message: str
    layer: str | None = Field(
        default=None,
        description="The layer's path in the model, for a hazard about one layer that inspection does not list.",
    )


def momentum_text(spec: dict[str, Any]) -> str:
    """How a layer's running statistics move, from its `NormSpec.config_dict()`: '-' where it keeps none, 'frozen (never
    updates)' for a frozen one (FrozenBatchNorm2d: its momentum field means nothing),
    else the momentum and convention."""
    if not spec.get("track_running_stats"):
        return "-"
    if spec.get("frozen"):
        return "frozen (never updates)"
    if spec.get("momentum") is None:
        return "None (cumulative average)"
    return f"{spec['momentum']!r} ({spec.get('momentum_convention', '?')})"


class LayerInspection(BaseModel):
    """One normalization layer of a model, in execution order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0, description="Position among the model's normalization layers.")
    path: str = Field(description="Module path (PyTorch), layer name (Keras) or node name (ONNX).")
    kind: str = Field(description="batch, layer, rms, group or instance.")
    layer_type: str = Field(default="", description="Class, aten op or ONNX op(s) the layer was read from.")
    native: bool = Field(
        default=True, description="One normalization op or module, not a decomposition into primitive ops."
    )
    folded: bool = Field(
        default=False, description="A BatchNorm folded into Mul/Add constants (tf2onnx): eps and statistics are gone."
    )
    origin: Origin
    spec: dict[str, Any] | None = Field(
        default=None, description="NormSpec.config_dict() (no tensors); None when the layer could not be read."
    )
    mode: Mode = "n/a"
    stats: StatsSummary | None = None
    hazards: list[Hazard] = Field(default_factory=list)

    @property
    def eps(self) -> float | None:
        return None if self.spec is None else self.spec.get("eps")

    def momentum_text(self) -> str:
        """The momentum with its convention, '-' where the layer has none."""
        return "-" if self.spec is None else momentum_text(self.spec)


class ModelInspection(BaseModel):
    """Every normalization layer of one model, plus model-level hazards; renders as text, JSON and a Rich table."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    framework: str = Field(description="torch, keras, onnx or spec.")
    source: str = Field(description="The file inspected, or a description of the in-memory object.")
    layers: list[LayerInspection] = Field(default_factory=list)
    hazards: list[Hazard] = Field(
        default_factory=list, description="Hazards of the model as a whole (e.g. a BatchNorm folded into a Conv)."
    )

    def all_hazards(self) -> list[tuple[str | None, Hazard]]:
        """(layer path or None for the model, hazard), model-level first."""
        found: list[tuple[str | None, Hazard]] = [(None, h) for h in self.hazards]
        found += [(layer.path, h) for layer in self.layers for h in layer.hazards]
        return found

    def worst_severity(self) -> str | None:
        """The highest severity among all hazards, None when there is none."""
        severities = [h.severity for _, h in self.all_hazards()]
        return max(severities, key=SEVERITY_RANK.__getitem__) if severities else None

    def has_hazard_at_least(self, severity: str) -> bool:
        worst = self.worst_severity()
        return worst is not None and SEVERITY_RANK[worst] >= SEVERITY_RANK[severity]

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=indent)

    def render_text(self) -> str:
        """Plain text: one line per layer, then each distinct hazard once with its layers and message."""
        lines = [f"{self.source} [{self.framework}]: {len(self.layers)} normalization layer(s)"]
        for layer in self.layers:
            eps = "-" if layer.eps is None else repr(layer.eps)
            stats = layer.stats.render_text() if layer.stats else "-"
            codes = ",".join(h.code for h in layer.hazards) or "-"
            kind = layer.kind + ("(folded)" if layer.folded else "" if layer.native else "(decomposed)")
            lines.append(
                f"  {layer.index:>3} {layer.path:<28} {kind:<8} eps={eps:<8} momentum={layer.momentum_text():<24} "
                f"{layer.mode:<5} {stats}  {codes}"
            )
        hazards = self.all_hazards()
        if hazards:
            lines.append("hazards:")  # one line per distinct hazard with its layers (to_json keeps one entry per layer)
            for group in group_hazards((path, h.code, h.severity, h.message, False) for path, h in hazards):
                lines.append(f"  {group.severity.upper():<7} {group.code:<20} {group.layers_text()}: {group.message}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render_text()


_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def dtype_text(spec: dict[str, Any] | None) -> str:
    """The layer's dtype ('bfloat16'), with the dtype it computes in when that differs
    ('float16 (computes in float32)')."""
    if spec is None or not spec.get("dtype"):
        return "-"
    compute = spec.get("compute_dtype")
    return spec["dtype"] + (f" (computes in {compute})" if compute and compute != spec["dtype"] else "")


def inspection_table(inspection: ModelInspection, path_labels: list[str] | None = None):
    """A rich.table.Table of the layers: index, path, kind, dtype, eps, momentum, mode, statistics, hazards.

    `path_labels` replaces the paths in the table (shortened ones, schemas/labels.py); `--json` keeps them whole.
    """
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{inspection.source} [{inspection.framework}]", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("path", overflow="fold")
    table.add_column("kind", overflow="fold")
    table.add_column("dtype", overflow="fold")
    table.add_column("eps", justify="right", no_wrap=True)
    table.add_column("momentum", overflow="fold")
    table.add_column("mode", no_wrap=True)
    table.add_column("running stats (min/mean/max)", overflow="fold")
    table.add_column("hazards", no_wrap=True)
    labels = path_labels or [layer.path for layer in inspection.layers]
    for layer, label in zip(inspection.layers, labels):
        kind = layer.kind + (" (folded)" if layer.folded else "" if layer.native else " (decomposed)")
        if layer.layer_type:
            kind += f"\n{layer.layer_type}"
        hazards = Text()
        for i, hazard in enumerate(layer.hazards):
            hazards.append(("\n" if i else "") + hazard.code, style=_SEVERITY_STYLE[hazard.severity])
        table.add_row(
            str(layer.index),
            label,
            kind,
            dtype_text(layer.spec),
            "-" if layer.eps is None else repr(layer.eps),
            layer.momentum_text().replace(" (", "\n("),
            layer.mode,
            _stats_cell(layer.stats),
            hazards if layer.hazards else "-",
        )
    return table


def _stats_cell(stats: StatsSummary | None) -> str:
    if stats is None:
        return "-"
    lines = [
        f"mean {stats.mean_min:.3g} / {stats.mean_mean:.3g} / {stats.mean_max:.3g}",
        f"var  {stats.var_min:.3g} / {stats.var_mean:.3g} / {stats.var_max:.3g}",
    ]
    if stats.num_batches_tracked is not None:
        lines.append(f"n={stats.num_batches_tracked}")
    return "\n".join(lines)


def severity_style(severity: str) -> str:
    """The Rich style the table and the CLI use for a severity."""
    return _SEVERITY_STYLE[severity]
