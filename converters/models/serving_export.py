"""Export for serving: the framework's own ONNX exporter, then verification, native ops, and the contract.

1. Export: torch through `torch.onnx.export(dynamo=True)`, Keras through
   `model.export(format="onnx")` (tf2onnx; at most the opset tf2onnx supports).
   torch.onnx's optimizer is off: its onnxscript `fuse_batchnorm` rewrite folds every eval
   BatchNorm into the preceding Conv, after which neither eps nor the statistics can be checked
   (or monitored by `drift`); constants are folded and dead nodes removed instead.
2. Rewrite (on by default): decomposed LayerNorm/RMSNorm/GroupNorm/InstanceNorm subgraphs and
   tf2onnx's folded BatchNorms become the native ops with the source's exact eps
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
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from schemas import CheckFailedError, NormbridgeError, NormSpec, UnsupportedObjectError
from schemas.floats import recover_from_float32
from schemas.kinds import KIND_INFO
from schemas.serving import ExportResult, RewrittenSite, SiteVerification

from .contract import contract_test
from .drift import describe
from .loading import framework_of_model, load_model
from .samples import Sample, as_sample, input_specs

STATE_SETTINGS = ("running_mean", "running_var", "scale", "bias")


# --------------------------------------------------------------------------- source specs


def _torch_specs_in_execution_order(module, sample: Sample) -> list[NormSpec]:
    """Specs of a module's normalization layers in the order a forward pass calls them (definition order can differ)."""
    import copy

    import torch

    from .walking import norm_layers, spec_of

    refs = norm_layers(module)
    order: list[int] = []
    probe = copy.deepcopy(module).eval()
    modules = dict(probe.named_modules())
    targets = [modules.get(r.path, probe if r.path == type(probe).__name__ else None) for r in refs]
    by_id = {id(m): i for i, m in enumerate(targets) if m is not None}
    handles = [m.register_forward_pre_hook(lambda mod, _args: order.append(by_id[id(mod)])) for m in targets if m is not None]
    try:
        with torch.no_grad():
            probe(*[torch.from_numpy(np.ascontiguousarray(a)) for a in sample.rows(slice(0, 2))])
    finally:
        for handle in handles:
            handle.remove()
    seen = list(dict.fromkeys(order)) + [i for i in range(len(refs)) if i not in order]
    return [spec_of(refs[i]) for i in seen]


def source_specs(model: Any, sample: Sample | None = None) -> list[NormSpec]:
    """The normalization specs of a torch module (execution order), ExportedProgram (graph order) or Keras model (layer order)."""
    framework = framework_of_model(model)
    if framework == "keras":
        from .walking import norm_layers, spec_of

        return [spec_of(r) for r in norm_layers(model)]
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        from .exported_program import exported_specs

        return exported_specs(model)
    if sample is not None:
        return _torch_specs_in_execution_order(model, sample)
    from .walking import norm_layers, spec_of

    return [spec_of(r) for r in norm_layers(model)]


# --------------------------------------------------------------------------- exporters


def _clean(model):
    """Fold constants and drop dead nodes (what torch.onnx's optimizer does, minus folding BatchNorm into Conv)."""
    import onnxscript.optimizer

    onnxscript.optimizer.fold_constants(model)
    onnxscript.optimizer.remove_unused_nodes(model)
    return model


def _export_torch(model, sample: Sample, opset: int) -> tuple[Any, str, list[str]]:
    import torch

    notes = ["torch.onnx's graph optimizer is off (it folds BatchNorm into Conv, losing eps and statistics); constants folded instead"]
    options = {"dynamo": True, "opset_version": opset, "optimize": False, "verbose": False}
    name = f"torch.onnx.export(dynamo=True, optimize=False) torch {torch.__version__.split('+')[0]} at opset {opset}"
    try:
        if isinstance(model, torch.export.ExportedProgram):
            program = torch.onnx.export(model, **options)
        else:
            rows = sample.rows(slice(0, 2)) if sample.batch_size >= 2 else tuple(np.concatenate([a, a]) for a in sample.arrays)
            args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in rows)
            batch = torch.export.Dim("batch", min=1)
            try:
                program = torch.onnx.export(model, args, dynamic_shapes=tuple({0: batch} for _ in args), **options)
            except Exception as error:  # a model that fixes its batch size: export it with the sample's
                notes.append(f"exported with a fixed batch of {sample.batch_size}: a dynamic batch failed ({type(error).__name__})")
                args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in sample.arrays)
                program = torch.onnx.export(model, args, **options)
    except NormbridgeError:
        raise
    except Exception as error:
        raise UnsupportedObjectError(f"torch.onnx.export failed at opset {opset} ({type(error).__name__}: {str(error).strip().splitlines()[0][:300]}).") from error
    return _clean(program.model_proto), name, notes


def _tf2onnx_max_opset() -> int:
    import tf2onnx.constants

    return max(tf2onnx.constants.OPSET_TO_IR_VERSION)


def _export_keras(model, sample: Sample, opset: int) -> tuple[Any, str, list[str]]:
    import tf2onnx

    from converters.onnx_adapter.files import load_onnx

    used = min(opset, _tf2onnx_max_opset())
    notes = []
    if used < opset:
        notes.append(f"tf2onnx {tf2onnx.__version__} writes at most opset {used}; the rewrite raises the opset only where a native op needs it")
    rows = sample.rows(slice(0, 1))
    model(rows[0] if len(rows) == 1 else list(rows), training=False)  # Keras exports only a model that has been called
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        try:
            model.export(str(path), format="onnx", opset_version=used, verbose=False)
        except Exception as error:
            raise UnsupportedObjectError(f"Keras's ONNX export failed ({type(error).__name__}: {str(error).strip().splitlines()[0][:300]}).") from error
        return load_onnx(path), f"keras.Model.export(format='onnx') via tf2onnx {tf2onnx.__version__} at opset {used}", notes


# --------------------------------------------------------------------------- Keras: BatchNorms folded into Conv weights

def _onnx_kernel(layer) -> np.ndarray | None:
    """A Keras convolution's kernel in ONNX Conv layout (out, in/groups, *window), or None for other layers."""
    from converters.keras_adapter.common import import_keras

    keras = import_keras()
    name = type(layer).__name__
    if name not in ("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv1D", "DepthwiseConv2D") or getattr(layer, "kernel", None) is None:
        return None
    kernel = keras.ops.convert_to_numpy(layer.kernel)
    n = kernel.ndim - 2
    if name.startswith("Depthwise"):  # (*window, C, multiplier) -> (C * multiplier, 1, *window), channel-major like TF
        merged = kernel.reshape(kernel.shape[:n] + (-1,))
        return np.ascontiguousarray(np.transpose(merged, (n, *range(n)))[:, None])
    return np.ascontiguousarray(np.transpose(kernel, (n + 1, n, *range(n))))


def _conv_batchnorm_pairs(keras_model, specs: list[NormSpec]) -> list:
    """Each Keras BatchNorm fed directly by a convolution, with the kernel in ONNX layout (graph.unfold.ConvBatchNorm)."""
    from converters.keras_adapter.common import import_keras
    from converters.onnx_adapter.graph.unfold import ConvBatchNorm

    keras = import_keras()
    by_name = {s.name: s for s in specs if s.kind == "batch" and s.track_running_stats and not s.training}
    pairs = []
    for layer in keras_model._flatten_layers(include_self=False, recursive=True):
        if not isinstance(layer, keras.layers.BatchNormalization) or layer.name not in by_name:
            continue
        try:
            producer = layer.input._keras_history[0]
        except (AttributeError, ValueError, IndexError):
            continue
        kernel = _onnx_kernel(producer)
        if kernel is None:
            continue
        bias = keras.ops.convert_to_numpy(producer.bias) if getattr(producer, "use_bias", False) and getattr(producer, "bias", None) is not None else None
        pairs.append(ConvBatchNorm(layer.name, kernel, bias, by_name[layer.name]))
    return pairs


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
            expected = spec.tensors.get(setting)
            if expected is None:
                continue
            got = exported.get(setting)
            if got is None:
                if setting in ("scale", "bias"):  # weights a decomposition may apply outside the matched nodes: the contract covers them
                    continue
                entries.append(_entry(label, spec, spec.kind, setting, f"float32[{expected.size}]", "not readable from the graph", False))
                continue
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
    from converters.onnx_adapter.files import save_onnx

    from converters.onnx_adapter.graph.sites import batchnorm_folded_into_conv, find_norm_sites
    from converters.onnx_adapter.graph.unfold import unfold_conv_batchnorms

    if isinstance(model, (str, Path)):
        model = load_model(model)
    framework = framework_of_model(model)
    if framework not in ("torch", "keras"):
        raise UnsupportedObjectError(f"export_for_serving takes a torch or Keras model; got a {framework} model.")
    try:
        specs_in = input_specs(model)
    except UnsupportedObjectError:
        specs_in = None
    if specs_in is None and sample is None:
        raise UnsupportedObjectError(f"a {type(model).__name__} does not record its input shape; pass a sample (an example input batch) to export it.")
    sample = as_sample(sample, specs_in)
    specs = source_specs(model, sample)
    exported, exporter, notes = (_export_keras if framework == "keras" else _export_torch)(model, sample, opset)
    errors: list[str] = []
    rewritten: list[RewrittenSite] = []
    final = exported
    if rewrite:
        from converters.onnx_adapter.graph.rewrite import rewrite_decompositions

        try:
            unfolded: list[str] = []
            candidate = exported
            if framework == "keras":
                candidate, unfolded = unfold_conv_batchnorms(candidate, _conv_batchnorm_pairs(model, specs))
            final, sites = rewrite_decompositions(candidate, opset, specs)
            rewritten = [RewrittenSite(name=s.name, kind=s.kind, from_ops=list(s.op_types), to_op=_native_op(s.kind), eps=s.eps) for s in sites]
            if unfolded:
                notes.append(f"{len(unfolded)} BatchNorm(s) that TF's grappler had folded into Conv kernels were unfolded with the source kernels")
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
    opset_written = max((o.version for o in final.opset_import if o.domain in ("", "ai.onnx")), default=0)
    result = ExportResult(source=describe(model), exporter=exporter, opset=opset_written, path=str(path) if written else None, written=written,
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
