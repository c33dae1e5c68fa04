"""Export for serving: the framework's own ONNX exporter, then verification, native ops, and the contract.

1. Export with the framework's own exporter (ModelAdapter.export_onnx): torch through
   `torch.onnx.export(dynamo=True)` with its BatchNorm-folding optimizer off, Keras through
   `model.export(format="onnx")` (tf2onnx; at most the opset tf2onnx supports).
2. Rewrite (on by default): what the exporter folded is unfolded with the source model
   (ModelAdapter.unfold_exported: TF's BatchNorms folded into Conv kernels), then decomposed
   LayerNorm/RMSNorm/GroupNorm/InstanceNorm subgraphs and tf2onnx's folded BatchNorms become the
   native ops with the source's exact eps
   (`onnx_adapter.graph.rewrite.rewrite_decompositions`).
3. Verify every normalization site of the final graph against the source layer it came from:
   eps exact after float32 recovery, running statistics, scale and bias equal as float32, and
   mode (no batch statistics where the source is in eval; a source in train mode fails, since
   serving must be eval).
4. Contract: `contract_test` on the final graph.
5. Write atomically only when 3 and 4 pass; otherwise raise CheckFailedError carrying the
   ExportResult, unless `force`, which writes and records the failure in the result.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from schemas import CheckFailedError, NormbridgeError, NormSpec, UnsupportedObjectError
from schemas.floats import recover_from_float32
from schemas.kinds import KIND_INFO
from schemas.serving import ExportResult, RewrittenSite, SiteVerification

from ...adapters import REGISTRY
from .contract import contract_test
from ..loading import load_model
from .samples import Sample, as_sample, input_specs

STATE_SETTINGS = ("running_mean", "running_var", "scale", "bias")


# --------------------------------------------------------------------------- source specs


def source_specs(model: Any, sample: Sample | None = None) -> list[NormSpec]:
    """The normalization specs of a torch module (execution order on `sample`), ExportedProgram (graph order) or Keras model (layer order)."""
    return REGISTRY.model_adapter_of(model).layer_specs(model, sample)


# --------------------------------------------------------------------------- verification


def _names_match(site_name: str, layer_name: str, exact: bool) -> bool:
    """Whether a graph site's name refers to a source layer: equal, or a '/'-separated part equal
    (tf2onnx scopes Keras layers as 'model_1/layer_1/...'; `exact` False also accepts that '_N' suffix)."""
    if site_name == layer_name:
        return True
    parts = re.split(r"[/:]", site_name)
    if exact:
        return layer_name in parts
    return any(re.fullmatch(re.escape(layer_name) + r"_\d+", part) for part in parts)


def _pair(specs: list[NormSpec], sites: list) -> list[tuple[NormSpec | None, Any | None]]:
    """Source specs and graph sites paired per kind: by name where names tell, the rest in order when their counts agree."""
    pairs: list[tuple[NormSpec | None, Any | None]] = []
    for kind in dict.fromkeys([s.kind for s in specs] + [site.kind for site in sites]):
        wanted = [s for s in specs if s.kind == kind]
        found = [site for site in sites if site.kind == kind]
        paired: dict[int, int] = {}
        for exact in (True, False):
            for i, spec in enumerate(wanted):
                if i in paired:
                    continue
                j = next((j for j, site in enumerate(found) if j not in paired.values() and _names_match(site.name, spec.name, exact)), None)
                if j is not None:
                    paired[i] = j
        rest_specs = [i for i in range(len(wanted)) if i not in paired]
        rest_sites = [j for j in range(len(found)) if j not in paired.values()]
        if len(rest_specs) == len(rest_sites):
            paired.update(zip(rest_specs, rest_sites))
            rest_specs, rest_sites = [], []
        order = sorted(paired, key=lambda i: paired[i])
        pairs += [(wanted[i], found[paired[i]]) for i in order]
        pairs += [(wanted[i], None) for i in rest_specs] + [(None, found[j]) for j in rest_sites]
    return pairs


def _entry(site: str, spec: NormSpec | None, kind: str, setting: str, expected: str, found: str, passed: bool, note: str = "") -> SiteVerification:
    return SiteVerification(site=site, source_layer=None if spec is None else spec.name, kind=kind, setting=setting,
                            expected=expected, found=found, passed=passed, note=note)


def expected_tensor(spec: NormSpec, setting: str) -> np.ndarray | None:
    """The tensor an exported graph holds for `setting`: the affine factor scale_offset + scale (Gemma's 1 + w), in its dtype."""
    tensor = spec.tensors.get(setting)
    if setting != "scale" or tensor is None or not spec.scale_offset:
        return tensor
    return (tensor.dtype.type(spec.scale_offset) + tensor).astype(tensor.dtype)


def verify_sites(specs: list[NormSpec], sites: list, missing_note: str = "the exporter removed or fused it beyond recognition") -> list[SiteVerification]:
    """Every normalization site of the exported graph against its source layer: presence, eps, state tensors, mode."""
    entries: list[SiteVerification] = []
    for spec, site in _pair(specs, sites):
        if site is None:
            entries.append(_entry("(missing)", spec, spec.kind, "presence", f"a {spec.kind} normalization", "none in the exported graph", False,
                                  missing_note))
            continue
        if spec is None:
            entries.append(_entry(site.name, None, site.kind, "presence", "no such layer in the source", f"{'+'.join(site.op_types)}", False,
                                  "the graph holds a normalization the source does not"))
            continue
        label = site.name
        if site.folded or site.eps is None:
            entries.append(_entry(label, spec, spec.kind, "eps", repr(spec.eps), "unreadable (folded into constants)", False,
                                  "the exporter folded this BatchNorm; export with rewrite on to restore the native op"))
        else:
            recovered = recover_from_float32(site.eps, hint=spec.eps)
            ok = bool(np.float32(site.eps) == np.float32(spec.eps))
            entries.append(_entry(label, spec, spec.kind, "eps", repr(spec.eps), repr(recovered), ok, "" if ok else "eps changed on export"))
        exported = site.spec.tensors if site.spec is not None else {}
        for setting in STATE_SETTINGS:
            expected = expected_tensor(spec, setting)
            if expected is None:
                continue
            got = exported.get(setting)
            if got is None:
                if setting in ("scale", "bias"):  # weights a decomposition may apply outside the matched nodes: the contract covers them
                    continue
                entries.append(_entry(label, spec, spec.kind, setting, f"float32[{expected.size}]", "not readable from the graph", False))
                continue
            if setting == "scale" and spec.scale_offset:
                # GemmaRMSNorm's `1.0 + weight.float()`: the exported graph holds the factor, computed in float32.
                expected = (expected.astype(np.float32) + np.float32(spec.scale_offset)).astype(np.float32)
            same = got.shape == expected.shape and np.array_equal(got.astype(np.float32), expected.astype(np.float32))
            note = "" if same else f"max |difference| {float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64)))):.3e}" if got.shape == expected.shape else "shape differs"
            entries.append(_entry(label, spec, spec.kind, setting, f"float32[{expected.size}]", "equal as float32" if same else "different", same, note))
        if KIND_INFO[spec.kind].running_stats and spec.track_running_stats:  # the layers whose output depends on the mode
            if spec.training:
                entries.append(_entry(label, spec, spec.kind, "mode", "eval (serving)", "source layer in train mode", False,
                                      "call .eval() on the model before exporting; torch.onnx silently serves running statistics for it"))
            else:
                entries.append(_entry(label, spec, spec.kind, "mode", "eval", "training_mode=1" if site.training_mode else "eval", not site.training_mode,
                                      "batch statistics in the serving graph" if site.training_mode else ""))
    return entries


# --------------------------------------------------------------------------- the export


def export_for_serving(model: Any, path: str | Path, opset: int = 23, rewrite: bool = True, force: bool = False, sample: Any = None,
                       *, tolerances: Any = None) -> ExportResult:
    """Export a torch or Keras model to ONNX for serving; write it only if verification and the contract pass (or `force`).

    Args:
        model: torch.nn.Module (needs `sample`), torch ExportedProgram, keras.Model, or a .pt2/.keras path.
        path: the .onnx file to write (atomically).
        opset: the highest opset the file may import.
        rewrite: replace decomposed or folded normalizations by native ops with the exact eps.
        force: write even when a check fails; the result records the failure.
        sample: inputs for the export (torch module) and the contract; default a seeded random sample.

    Raises:
        CheckFailedError: verification or the contract failed and `force` is off (`.result` is the ExportResult; nothing written).
    """
    from ...onnx_adapter.files import save_onnx
    from ...onnx_adapter.graph.sites import batchnorm_folded_into_conv, find_norm_sites
    from ...onnx_adapter.proto import opset_of

    if isinstance(model, (str, Path)):
        model = load_model(model)
    adapter = REGISTRY.model_adapter_of(model)
    if not adapter.serving_source:
        raise UnsupportedObjectError(f"export_for_serving takes a torch or Keras model; got a {adapter.framework} model.")
    try:
        specs_in = input_specs(model)
    except UnsupportedObjectError:
        specs_in = None
    if specs_in is None and sample is None:
        raise UnsupportedObjectError(f"a {type(model).__name__} does not record its input shape; pass a sample (an example input batch) to export it.")
    sample = as_sample(sample, specs_in)
    specs = source_specs(model, sample)
    exported, exporter, notes = adapter.export_onnx(model, sample, opset)
    errors: list[str] = []
    rewritten: list[RewrittenSite] = []
    final = exported
    if rewrite:
        from ...onnx_adapter.graph.rewrite import rewrite_decompositions

        try:
            candidate, unfold_notes = adapter.unfold_exported(exported, model, specs)
            final, sites = rewrite_decompositions(candidate, opset, specs)
            rewritten = [RewrittenSite(name=s.name, kind=s.kind, from_ops=list(s.op_types), to_op=_native_op(s.kind), eps=s.eps) for s in sites]
            notes += unfold_notes
        except NormbridgeError as error:
            errors.append(f"rewrite failed, the exporter's graph is kept: {error}")
    missing = "the exporter removed or fused it beyond recognition"
    if batchnorm_folded_into_conv(final):
        missing = "the exporter folded it into the preceding Conv's weights: its eps and statistics are gone from the graph"
    verification = verify_sites(specs, find_norm_sites(final), missing)
    contract = contract_test(model, final, sample, tolerances)
    passed = not errors and all(v.passed for v in verification) and contract.passed
    written = passed or force
    if written:
        save_onnx(final, path)
    opset_written = opset_of(final)
    result = ExportResult(source=adapter.describe(model), exporter=exporter, opset=opset_written, path=str(path) if written else None, written=written,
                          forced=force and not passed, verification=verification, rewritten=rewritten, contract=contract, notes=notes,
                          errors=errors, passed=passed)
    if not written:
        raise CheckFailedError(f"export refused, nothing written to '{path}': {_reason(result)}; fix the model or pass force=True (--force) to write it anyway.", result)
    return result


def _native_op(kind: str) -> str:
    return KIND_INFO[kind].onnx_op


def _reason(result: ExportResult) -> str:
    failed = result.failed_checks
    parts = []
    if failed:
        first = failed[0]
        parts.append(f"{len(failed)} verification check(s) failed, first {first.site} ({first.source_layer}) {first.setting}: expected {first.expected}, found {first.found}")
    if result.contract is not None and not result.contract.passed:
        bad = [o.name for o in result.contract.outputs if not o.passed] + [f"batch independence ({b.side})" for b in result.contract.batch_independence if not b.passed]
        parts.append(f"the serving contract failed ({', '.join(bad) or 'see errors'})")
    parts += result.errors
    return "; ".join(parts) or "unknown"


__all__ = ["export_for_serving", "source_specs", "verify_sites"]
