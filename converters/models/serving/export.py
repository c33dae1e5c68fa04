"""Export for serving: the framework's own ONNX exporter, then verification, native ops, and the contract.

0. The source's warning- and error-level hazards, as `inspect` reports them (`source_hazards`).
1. Export with the framework's own exporter (ModelAdapter.export_onnx): torch through
   `torch.onnx.export(dynamo=True)` with its BatchNorm-folding optimizer off, Keras through
   `model.export(format="onnx")` (tf2onnx; at most the opset tf2onnx supports). A graph above
   `opset` is converted down with onnx's version converter or refused (`opset.cap_opset`).
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
5. Write atomically only when 3 and 4 pass and 0 found no error; otherwise raise CheckFailedError carrying the
   ExportResult, unless `force`, which writes and records the failure in the result.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from schemas import CheckFailedError, InputFileError, NormbridgeError, NormSpec, UnsupportedObjectError
from schemas.kinds import KIND_INFO
from schemas.serving import ExportResult, RewrittenSite

from ...adapters import REGISTRY
from .contract import contract_test
from ..loading import load_model
from .opset import cap_opset, exporter_opset
from .samples import as_sample, input_specs
from .source_hazards import serving_hazards
from .verification import source_specs, verify_sites


# --------------------------------------------------------------------------- the export


def export_for_serving(
    model: Any,
    path: str | Path,
    opset: int = 23,
    rewrite: bool = True,
    force: bool = False,
    sample: Any = None,
    *,
    tolerances: Any = None,
    answered: dict[str, str] | None = None,
) -> ExportResult:
    """Export a torch or Keras model to ONNX for serving; write it only if verification,
    the contract and the hazards pass (or `force`).

    Args:
        model: torch.nn.Module (needs `sample`), torch ExportedProgram, keras.Model, or a .pt2/.keras path.
        path: the .onnx file to write (atomically).
        opset: the highest opset the file may import; a graph the exporter wrote above it is converted down, or refused.
        rewrite: replace decomposed or folded normalizations by native ops with the exact eps.
        force: write even when a check fails or the source has an error-level hazard; the result records it.
        sample: inputs for the export (torch module) and the contract; default a seeded random sample.
        answered: hazard code -> why it does not apply, known beyond the model (a registry version's lineage: a
            recalibrated version's statistics are a cumulative average, never unconverged);
            such hazards become notes saying so.

    Raises:
        CheckFailedError: verification, the contract or an error-level hazard failed and `force` is off
            (`.result` is the ExportResult; nothing written).
        UnsupportedObjectError: the exported graph cannot be taken down to `opset` (nothing written, whatever `force`).
    """
    from ...onnx_adapter.files import save_onnx
    from ...onnx_adapter.graph.sites import batchnorm_folded_into_conv, find_norm_sites
    from ...onnx_adapter.proto import opset_of

    if isinstance(model, (str, Path)):
        model = load_model(model)
    adapter = REGISTRY.model_adapter_of(model)
    if not adapter.serving_source:
        raise UnsupportedObjectError(
            f"an {adapter.framework} model is already in the format the serving export writes: serve the file as it "
            "is (`normbridge inspect` lists its normalization layers and hazards); the export takes the training "
            "framework's model, a torch (.pt2, nn.Module) or Keras (.keras) one."
        )
    try:
        specs_in = input_specs(model)
    except UnsupportedObjectError:
        specs_in = None
    if specs_in is None and sample is None:
        raise UnsupportedObjectError(
            f"a {type(model).__name__} does not record its input shape; pass a sample (an example input batch) to export it."
        )
    sample = as_sample(sample, specs_in)
    specs = source_specs(model, sample)
    hazards = serving_hazards(model)
    waived = [
        f"{h.code} in {h.layer or 'the model'} is not raised: {answered[h.code]}"
        for h in hazards
        if answered and h.code in answered
    ]
    hazards = [h for h in hazards if not answered or h.code not in answered]
    asked, known_notes = exporter_opset(opset)
    exported, exporter, notes = adapter.export_onnx(model, sample, asked)
    notes = [*waived, *known_notes, *notes]
    exported, opset_notes = cap_opset(exported, opset)
    notes += opset_notes
    final, rewritten, errors = (
        _rewrite(adapter, model, exported, specs, opset, notes) if rewrite else (exported, [], [])
    )
    if opset_of(final) > opset:  # the rewrite raises the opset only up to the cap; a breach is a bug, never a file
        raise UnsupportedObjectError(
            f"the graph ended at opset {opset_of(final)}, above --opset {opset}; nothing was written."
        )
    missing = "the exporter removed or fused it beyond recognition"
    if batchnorm_folded_into_conv(final):
        missing = (
            "the exporter folded it into the preceding Conv's weights: its eps and statistics are gone from the graph"
        )
    sites = find_norm_sites(final)
    verification = verify_sites(specs, sites, missing)
    if any(
        v.setting == "presence" and not v.passed for v in verification
    ):  # a layer absent: dead code in the source, which the exporter dropped?
        unused = adapter.unused_layers(model, sample)
        if unused:
            verification = verify_sites(specs, sites, missing, unused)
            skipped = [v.source_layer for v in verification if v.passed and v.setting == "presence"]
            if skipped:
                notes.append(
                    f"{len(skipped)} layer(s) not checked, absent from the exported graph because their output reaches no "
                    f"output of the source (dead code the exporter dropped): {', '.join(skipped)}"
                )
    contract = _contract(model, final, sample, tolerances, errors)
    passed = (
        contract is not None
        and not errors
        and all(v.passed for v in verification)
        and contract.passed
        and not any(h.severity == "error" for h in hazards)
    )
    written = passed or force
    if written:
        save_onnx(final, path)
    result = ExportResult(
        source=adapter.describe(model),
        exporter=exporter,
        opset=opset_of(final),
        path=str(path) if written else None,
        written=written,
        forced=force and not passed,
        verification=verification,
        rewritten=rewritten,
        contract=contract,
        hazards=hazards,
        notes=notes,
        errors=errors,
        passed=passed,
    )
    if not written:
        raise CheckFailedError(
            f"export refused, nothing written to '{path}': {_reason(result)}; fix the model or pass force=True (--force) to write it anyway.",
            result,
        )
    return result


def _contract(model: Any, final, sample, tolerances, errors: list[str]):
    """The contract on the final graph, or None with the reason in `errors` when this runtime cannot run it (a bfloat16
    graph on onnxruntime's CPU provider): the verification above still stands,
    and the result says the outputs were not compared."""
    from ...onnx_adapter.running import computes_in_bfloat16

    try:
        return contract_test(
            model, final, sample, tolerances, diagnose=False
        )  # the verification names layers and settings
    except InputFileError as error:
        missing = re.search(r"No Op registered for (\w+) with domain_version of (\d+)", error.message)
        if (
            missing
        ):  # the graph the exporter wrote, not the user's file: an op this onnxruntime cannot run at that opset
            import onnxruntime

            raise UnsupportedObjectError(
                f"the exported graph uses {missing.group(1)} at opset {missing.group(2)}, which onnxruntime {onnxruntime.__version__}'s CPU "
                f"provider cannot run, so the file cannot be checked; export at a lower --opset (23, the default, is the one "
                f"normbridge's tests run) ({error.message})"
            ) from error
        if not computes_in_bfloat16(final):
            raise
        errors.append(f"not checked: {error.message}")
        return None


def _rewrite(
    adapter, model: Any, exported, specs: list[NormSpec], opset: int, notes: list[str]
) -> tuple[Any, list[RewrittenSite], list[str]]:
    """(final graph, rewritten sites, errors): unfold what the exporter folded,
    then native ops for decompositions (notes extended)."""
    from ...onnx_adapter.graph.rewrite import rewrite_decompositions

    try:
        candidate, unfold_notes = adapter.unfold_exported(exported, model, specs)
        final, sites = rewrite_decompositions(candidate, opset, specs)
    except NormbridgeError as error:
        return exported, [], [f"rewrite failed, the exporter's graph is kept: {error}"]
    notes += unfold_notes
    return (
        final,
        [
            RewrittenSite(name=s.name, kind=s.kind, from_ops=list(s.op_types), to_op=_native_op(s.kind), eps=s.eps)
            for s in sites
        ],
        [],
    )


def _native_op(kind: str) -> str:
    return KIND_INFO[kind].onnx_op


def _reason(result: ExportResult) -> str:
    failed = result.failed_checks
    parts = []
    if failed:
        first = failed[0]
        parts.append(
            f"{len(failed)} verification check(s) failed, first {first.site} ({first.source_layer}) {first.setting}: expected {first.expected}, found {first.found}"
        )
    if result.contract is not None and not result.contract.passed:
        bad = [o.name for o in result.contract.outputs if not o.passed] + [
            f"batch independence ({b.side})" for b in result.contract.batch_independence if not b.passed
        ]
        parts.append(f"the serving contract failed ({', '.join(bad) or 'see errors'})")
    if result.error_hazards:
        first = result.error_hazards[0]
        parts.append(
            f"{len(result.error_hazards)} error-level hazard(s) in the source, first {first.code} in {first.layer or 'the model'}"
        )
    parts += result.errors
    return "; ".join(parts) or "unknown"


__all__ = ["export_for_serving", "source_specs", "verify_sites"]
