"""Results of the serving tools: contract test, export for serving, drift monitor, recalibration.

Each is a frozen pydantic model that renders as plain text (`render_text`) and JSON (`to_json`),
so the CLI, the registry and scripts read the same structure. Errors that cannot be computed
(an output of another shape, a batch the model refuses) are `None` with a reason, never NaN or
infinity, so the JSON stays strict.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=indent)


def _num(value: float | None, spec: str = ".3e") -> str:
    return "n/a" if value is None else format(value, spec)


# --------------------------------------------------------------------------- contract


class Tolerance(_Result):
    """Elementwise |serving - source| <= atol + rtol * |source| for outputs of this dtype."""

    dtype: str
    atol: float
    rtol: float


class SampleInfo(_Result):
    """The inputs replayed: where they came from and their shapes."""

    description: str
    shapes: list[list[int]]
    dtypes: list[str]
    seed: int | None = None
    path: str | None = None


class OutputCheck(_Result):
    """One model output, source (eval) against serving (onnxruntime)."""

    name: str
    shape: list[int]
    dtype: str
    max_abs_error: float | None
    max_rel_error: float | None = Field(description="Max |difference| / |source| over elements with |source| >= atol.")
    atol: float
    rtol: float
    passed: bool
    reason: str = ""


class BatchIndependenceCheck(_Result):
    """Does a request's output depend on the other requests in its batch? (a layer left in train mode does)."""

    side: Literal["source", "serving"]
    method: Literal["alone", "replaced", "skipped"] = Field(
        description="alone: each request run as a batch of one; replaced: the other rows of a fixed-size batch replaced by different requests."
    )
    requests: int
    max_abs_difference: float | None
    max_rel_difference: float | None
    deterministic: bool = Field(description="Running the same batch twice gave identical outputs.")
    passed: bool
    reason: str = ""


class SiteVerification(_Result):
    """One setting of one normalization site of the exported graph against the source layer's spec."""

    site: str = Field(description="Name of the normalization site in the exported graph.")
    source_layer: str | None
    kind: str
    setting: str = Field(description="presence, kind, eps, running_mean, running_var, scale, bias or mode.")
    expected: str
    found: str
    passed: bool
    note: str = ""


class ContractResult(_Result):
    """Verdict of `contract_test`: the serving model computes what the source computes in eval mode."""

    source: str
    serving: str
    runtime: str
    sample: SampleInfo
    tolerances: list[Tolerance]
    outputs: list[OutputCheck] = Field(default_factory=list)
    batch_independence: list[BatchIndependenceCheck] = Field(default_factory=list)
    findings: list[str] = Field(
        default_factory=list,
        description="Train-mode layers or nodes found in the source or serving model; "
        "for differing outputs, the first one and the layers and settings behind it.",
    )
    differing_settings: list[SiteVerification] = Field(
        default_factory=list,
        description="Normalization settings of the serving graph "
        "that differ from their source layer (looked for when an output differs).",
    )
    errors: list[str] = Field(default_factory=list)
    passed: bool

    def render_text(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        tol = ", ".join(f"{t.dtype} atol {t.atol:g} rtol {t.rtol:g}" for t in self.tolerances)
        lines = [
            f"serving contract: {verdict}",
            f"  source   {self.source}",
            f"  serving  {self.serving} ({self.runtime})",
            f"  sample   {self.sample.description}",
            f"  tolerance {tol}",
        ]
        for o in self.outputs:
            mark = "ok" if o.passed else "MISMATCH"
            lines.append(
                f"  output {o.name:<16} {o.dtype}{o.shape}  max abs {_num(o.max_abs_error)}  max rel {_num(o.max_rel_error)}  {mark}"
                + (f"  ({o.reason})" if o.reason else "")
            )
        for b in self.batch_independence:
            mark = "ok" if b.passed else "FAILED"
            if b.method == "skipped":
                lines.append(f"  batch independence {b.side:<7} skipped ({b.reason})")
                continue
            lines.append(
                f"  batch independence {b.side:<7} {b.method} x{b.requests}  max abs diff {_num(b.max_abs_difference)}  "
                f"deterministic {'yes' if b.deterministic else 'NO'}  {mark}" + (f"  ({b.reason})" if b.reason else "")
            )
        lines += [f"  finding: {f}" for f in self.findings]
        lines += [f"  error: {e}" for e in self.errors]
        return "\n".join(lines)


# --------------------------------------------------------------------------- export


class RewrittenSite(_Result):
    """A decomposed (or folded) normalization the export replaced by the native ONNX op."""

    name: str
    kind: str
    from_ops: list[str]
    to_op: str
    eps: float | None


class ServingHazard(_Result):
    """A warning- or error-level hazard `inspect` reports on the source model, repeated by the serving export."""

    layer: str | None = Field(description="The source layer's path, or None for a hazard of the model as a whole.")
    code: str
    severity: Literal["warning", "error"]
    message: str


class ExportResult(_Result):
    """What `export_for_serving` did: exporter, verification per site, rewrites, contract, hazards,
    and whether it wrote."""

    source: str
    exporter: str
    opset: int
    path: str | None
    written: bool
    forced: bool
    verification: list[SiteVerification] = Field(default_factory=list)
    rewritten: list[RewrittenSite] = Field(default_factory=list)
    contract: ContractResult | None = None
    hazards: list[ServingHazard] = Field(
        default_factory=list, description="Error-level ones refuse the export unless forced."
    )
    notes: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    passed: bool

    @property
    def error_hazards(self) -> list[ServingHazard]:
        return [h for h in self.hazards if h.severity == "error"]

    @property
    def failed_checks(self) -> list[SiteVerification]:
        return [v for v in self.verification if not v.passed]

    def render_text(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        where = self.path if self.written else "nothing written"
        lines = [f"export for serving: {verdict}; {where}" + (" (forced)" if self.forced else "")]
        lines.append(f"  exporter {self.exporter}; file opset {self.opset}")
        lines.append(f"  source {self.source}")
        sites = sorted({v.site for v in self.verification})
        failed = self.failed_checks
        lines.append(
            f"  verification: {len(sites)} normalization sites, {len(self.verification)} settings checked, {len(failed)} failed"
        )
        for v in failed:
            lines.append(
                f"    {v.site} ({v.source_layer}) {v.setting}: expected {v.expected}, found {v.found}"
                + (f"  ({v.note})" if v.note else "")
            )
        groups: dict[tuple, list[str]] = {}
        for r in self.rewritten:
            groups.setdefault(("+".join(r.from_ops), r.to_op, r.eps), []).append(r.name)
        for (ops, to_op, eps), names in groups.items():
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            lines.append(
                f"  rewrote {len(names)} x {ops} -> {to_op}" + ("" if eps is None else f" eps={eps!r}") + f": {shown}"
            )
        if self.contract is not None:
            lines += ["  " + line for line in self.contract.render_text().splitlines()]
        lines += [f"  {h.severity} {h.code} {h.layer or '(model)'}: {h.message}" for h in self.hazards]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  error: {e}" for e in self.errors]
        return "\n".join(lines)


# --------------------------------------------------------------------------- drift


class DriftThresholds(_Result):
    """A layer alarms when either statistic exceeds its threshold on some channel."""

    shift: float = Field(
        0.5, description="Max standardized mean shift |mean - running_mean| / sqrt(running_var + eps)."
    )
    log_ratio: float = Field(
        0.6931471805599453, description="Max |log(var / running_var)|; log(2) = a factor of two either way."
    )


#: Why a layer is reported: its input matches its statistics, its input moved, or its statistics never converged.
LayerStatus = Literal["ok", "drift", "unconverged_statistics"]


class DriftLayer(_Result):
    """One BatchNorm layer: serving-time input statistics against its frozen running statistics.

    `alarm` says a threshold was exceeded; `status` says why: 'drift' (the input moved) or 'unconverged_statistics'
    (the running statistics still hold much of their initial mean 0 / variance 1, so no input could match them)."""

    name: str
    channels: int
    max_shift: float
    mean_shift: float
    worst_shift_channel: int
    max_abs_log_ratio: float
    mean_abs_log_ratio: float
    worst_ratio_channel: int
    alarm: bool
    status: LayerStatus = Field("ok", description="ok, drift, or unconverged_statistics (see `reason`).")
    reason: str | None = Field(None, description="Why the statistics are judged unconverged, with the evidence.")
    batches_tracked: int | None = Field(
        None, description="num_batches_tracked where the model keeps it (torch), else None."
    )
    momentum: float | None = Field(
        None, description="The layer's momentum (torch convention: weight of the new batch), where known."
    )
    initial_weight: float | None = Field(
        None,
        description="Share of the initial values (mean 0, variance 1) still in the running "
        "statistics: (1 - momentum) ** batches_tracked, or 1.0 when they are exactly the initial values.",
    )

    @model_validator(mode="before")
    @classmethod
    def _status_of_older_records(cls, data):
        """A report stored before `status` existed reads as 'drift' where it alarmed."""
        if isinstance(data, dict) and "status" not in data:
            data = {**data, "status": "drift" if data.get("alarm") else "ok"}
        return data


class DriftReport(_Result):
    """Verdict of `drift_check` over every BatchNorm layer, in execution order.

    `alarms` lists the layers whose input moved (status 'drift'); `unconverged` those whose statistics never
    converged."""

    model: str
    framework: str
    samples: int
    thresholds: DriftThresholds
    variance: str = "population variance (ddof=0) of the layer input per channel over batch and spatial positions"
    layers: list[DriftLayer]
    alarms: list[str]
    unconverged: list[str] = Field(default_factory=list)
    verdict: Literal["no drift", "drift", "unconverged statistics"]
    statistics_digest: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description=(
            "sha256 of the running statistics the report compared against (schemas.monitoring.statistics_digest): a report is "
            "recorded only against a version holding the same statistics."
        ),
    )

    def render_text(self) -> str:
        t = self.thresholds
        lines = [
            f"drift: {self.verdict.upper()} ({len(self.alarms)} of {len(self.layers)} BatchNorm layers drifted, {len(self.unconverged)} with "
            f"unconverged statistics) on {self.samples} samples, {self.model}",
            f"  thresholds: standardized mean shift > {t.shift:g} or |log variance ratio| > {t.log_ratio:.4g} on any channel",
            f"  {'layer':<28} {'ch':>4} {'max shift':>10} {'mean shift':>10} {'max|log r|':>10}  alarm",
        ]
        for layer in self.layers:
            lines.append(
                f"  {layer.name:<28} {layer.channels:>4} {layer.max_shift:>10.3f} {layer.mean_shift:>10.3f} {layer.max_abs_log_ratio:>10.3f}  "
                + ("ALARM" if layer.alarm else "-")
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------- recalibration


class RecalibratedLayer(_Result):
    """How far one BatchNorm layer's running statistics moved."""

    name: str
    channels: int
    max_mean_shift: float = Field(description="Max |new_mean - old_mean| / sqrt(old_var + eps) over channels.")
    max_abs_log_var_ratio: float = Field(description="Max |log(new_var / old_var)| over channels.")


class RecalibrationReport(_Result):
    """What `recalibrate` did: per layer movement, the data it used and how."""

    model: str
    framework: str
    method: str
    batches: int
    samples: int
    variance_estimator: Literal["unbiased", "biased"]
    layers: list[RecalibratedLayer]
    output: str | None = None
    registered: bool = Field(
        False,
        description="True with `recalibrate --register NAME@N`: the output became a 'recalibrated' child "
        "version of NAME@N (else `normbridge register NAME FILE --parent NAME@N --operation recalibrated` does it).",
    )
    version: str | None = Field(None, description="The registered version 'NAME@M' (with --register).")
    parent: str | None = Field(None, description="The version it was recalibrated from (with --register).")
    diff: str | None = Field(
        None,
        description="The diff's headline against the parent, e.g. 'weights identical, running statistics "
        "changed in 3 layers'.",
    )
    notes: list[str] = Field(default_factory=list)

    def render_text(self) -> str:
        lines = [
            f"recalibrated {len(self.layers)} BatchNorm layers of {self.model} on {self.samples} samples in {self.batches} batches",
            f"  method: {self.method}",
            f"  {'layer':<28} {'ch':>4} {'max |dmean|/std':>16} {'max |log var ratio|':>20}",
        ]
        for layer in self.layers:
            lines.append(
                f"  {layer.name:<28} {layer.channels:>4} {layer.max_mean_shift:>16.4f} {layer.max_abs_log_var_ratio:>20.4f}"
            )
        if self.output:
            lines.append(f"  wrote {self.output}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)
