"""Why a contract failed: the first output that differs and, where the graph tells, the layer and the setting.

Outputs alone cannot say which layer moved: an eps changed in one BatchNorm of the ONNX file
shows up as a mismatch of the logits. The serving graph's normalization sites are therefore
checked against the source layers as the serving export checks them (`verification.verify_sites`),
and every setting that differs is named with the layer it belongs to.
"""

from __future__ import annotations

from typing import Any

from schemas import NormbridgeError
from schemas.serving import OutputCheck, SiteVerification

from .samples import Sample
from .verification import source_specs, verify_sites

#: Differing settings spelled out in the findings (the JSON's `differing_settings` holds all of them).
SHOWN = 5


def _output_line(first: OutputCheck) -> str:
    if first.max_abs_error is None:
        return f"first differing output: {first.name} ({first.reason or 'not comparable'})"
    return (
        f"first differing output: {first.name}, max abs error {first.max_abs_error:.3e} "
        f"(tolerance atol {first.atol:g} + rtol {first.rtol:g} x |source|)"
    )


def differing_settings(source: Any, serving: Any, sample: Sample) -> list[SiteVerification]:
    """Every normalization setting of the serving graph that differs from its source layer
    (presence, eps, state, mode)."""
    from ...onnx_adapter.graph.sites import find_norm_sites

    return [v for v in verify_sites(source_specs(source, sample), find_norm_sites(serving)) if not v.passed]


def mismatch_findings(
    source: Any, serving: Any, sample: Sample, outputs: list[OutputCheck]
) -> tuple[list[str], list[SiteVerification]]:
    """(findings to print, differing settings) for a contract whose outputs differ; ([], []) when they agree."""
    bad = [o for o in outputs if not o.passed]
    if not bad:
        return [], []
    findings = [_output_line(bad[0])]
    try:
        differing = differing_settings(source, serving, sample)
    except NormbridgeError as error:
        return findings + [
            f"the serving graph's normalizations could not be compared with the source's layers ({error})"
        ], []
    for v in differing[:SHOWN]:
        where = v.source_layer or "(no source layer)"
        note = f" ({v.note})" if v.note and not v.note.startswith(v.setting) else ""
        findings.append(
            f"layer {where}, graph site {v.site}, setting {v.setting}: source {v.expected}, serving {v.found}{note}"
        )
    if len(differing) > SHOWN:
        findings.append(f"... and {len(differing) - SHOWN} more differing setting(s) (see --json: differing_settings)")
    if not differing:
        findings.append(
            "every normalization site of the serving graph matches its source layer (eps, statistics, scale, bias, mode): "
            "the difference comes from another op or its weights"
        )
    return findings, differing


__all__ = ["differing_settings", "mismatch_findings"]
