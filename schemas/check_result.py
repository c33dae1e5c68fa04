"""The structured result of an equivalence check (the registry's gate reads it)."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["passed", "failed", "not_expressible", "skipped"]


class OutputComparison(BaseModel):
    """Eval-mode output of one framework against the NumPy reference."""

    model_config = ConfigDict(extra="forbid")

    framework: str
    max_abs_error: float
    max_rel_error: float
    atol: float
    rtol: float
    passed: bool


class StatsComparison(BaseModel):
    """Running statistics after one training step, against the reference for that framework."""

    model_config = ConfigDict(extra="forbid")

    framework: str
    variance_estimator: str
    max_abs_error_mean: float
    max_abs_error_var: float
    expected_var_difference_vs_source: float = Field(
        description="Max |running_var - source framework's running_var| predicted from the estimator difference (0 when the same)."
    )
    observed_var_difference_vs_source: float
    passed: bool


class TargetCheck(BaseModel):
    """One target framework: conversion, spec round trip, outputs and training step."""

    model_config = ConfigDict(extra="forbid")

    framework: str
    status: Status
    reason: str = ""
    spec_differences: list[str] = Field(
        default_factory=list, description="Portable fields that changed on the way to the target."
    )
    round_trip_differences: list[str] = Field(
        default_factory=list, description="Fields that changed after converting back to the source framework."
    )
    warnings: list[str] = Field(default_factory=list)


class CheckResult(BaseModel):
    """Verdict of `converters.check` for one layer."""

    model_config = ConfigDict(extra="forbid")

    layer: str
    kind: str
    source_framework: str
    dtype: str
    passed: bool
    targets: list[TargetCheck] = Field(default_factory=list)
    outputs: list[OutputComparison] = Field(default_factory=list)
    training_step: list[StatsComparison] = Field(default_factory=list)
    probe_shape: list[int] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=indent)

    def render_text(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [f"check {self.layer} [{self.kind}, {self.dtype}, from {self.source_framework}]: {verdict}"]
        for t in self.targets:
            lines.append(f"  {t.framework:<6} {t.status}{': ' + t.reason if t.reason else ''}")
            lines += [f"         spec: {d}" for d in t.spec_differences]
            lines += [f"         round trip: {d}" for d in t.round_trip_differences]
            lines += [f"         warning: {w}" for w in t.warnings]
        for o in self.outputs:
            mark = "ok" if o.passed else "MISMATCH"
            lines.append(
                f"  eval {o.framework:<6} max abs {o.max_abs_error:.3e}  max rel {o.max_rel_error:.3e}  (atol {o.atol:g}, rtol {o.rtol:g}) {mark}"
            )
        for s in self.training_step:
            mark = "ok" if s.passed else "MISMATCH"
            lines.append(
                f"  train {s.framework:<6} [{s.variance_estimator}] mean err {s.max_abs_error_mean:.2e} var err {s.max_abs_error_var:.2e}; "
                f"vs source var: expected {s.expected_var_difference_vs_source:.2e} observed {s.observed_var_difference_vs_source:.2e} {mark}"
            )
        lines += [f"  error: {e}" for e in self.errors]
        return "\n".join(lines)
