"""The serving contract: the ONNX file computes what the source model computes in eval mode.

Two tests on one fixed sample. Equality: the sample through the source in eval mode (a deep copy
of a torch module put in `.eval()`, a Keras model called with `training=False`, an
ExportedProgram as traced) and through onnxruntime, per output within stated tolerances. Batch
independence, on both sides: each request run alone equals its row in the batch, and the same
batch run twice gives the same bytes; a layer left in train mode (batch statistics, active
dropout) breaks it.

onnxruntime runs the graph as written (graph optimizations disabled). Its default optimizer
deletes Dropout nodes even when their training_mode input is true, and computes a
BatchNormalization with training_mode=1 whose statistic outputs are unused with neither
running nor batch statistics (seen with onnxruntime 1.32), so with it a train-mode export can
pass or fail by accident. The file as written is what other runtimes execute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from schemas import InputFileError
from schemas.serving import (
    BatchIndependenceCheck,
    ContractResult,
    OutputCheck,
    SampleInfo,
    Tolerance,
)

from ...adapters import REGISTRY
from ...model_values import ModelRunner, Outputs
from ..loading import load_model
from .diagnosis import mismatch_findings
from .samples import DEFAULT_BATCH, DEFAULT_SEED, Sample, as_sample, merge_specs

#: (atol, rtol) per output dtype for a whole model: |serving - source| <= atol + rtol * |source|.
#: Looser than one layer's (converters.equivalence.TOLERANCES): a network accumulates float32
#: reordering through every Conv and MatMul, and exporters fuse or reorder ops.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (1e-2, 1e-2),
    "float32": (1e-4, 1e-3),
    "float64": (1e-8, 1e-7),
}


# --------------------------------------------------------------------------- source side


def source_runner(source: Any) -> ModelRunner:
    """Runner for a torch nn.Module (deep copy in eval), an ExportedProgram or a Keras model (training=False)."""
    if isinstance(source, (str, Path)):
        source = load_model(source)
    return REGISTRY.model_adapter_of(source).source_runner(source)


# --------------------------------------------------------------------------- serving side


def serving_runner(model: Any, optimized: bool = False) -> ModelRunner:
    """Runner for an onnx.ModelProto (or .onnx path) on onnxruntime's CPU provider, as written unless `optimized`."""
    if isinstance(model, (str, Path)):
        model = load_model(model)
    return REGISTRY.model_adapter_of(model).serving_runner(model, optimized)


# --------------------------------------------------------------------------- the tests


def resolve_tolerances(tolerances: Any = None) -> dict[str, tuple[float, float]]:
    """Defaults, updated by a dict {dtype: (atol, rtol)} or replaced for every float dtype by one (atol, rtol)."""
    table = dict(DEFAULT_TOLERANCES)
    if isinstance(tolerances, dict):
        table.update({k: (float(a), float(r)) for k, (a, r) in tolerances.items()})
    elif tolerances is not None:
        atol, rtol = tolerances
        table = {k: (float(atol), float(rtol)) for k in table}
    return table


def _tolerance(table: dict[str, tuple[float, float]], dtype: np.dtype) -> tuple[float, float]:
    return table.get(np.dtype(dtype).name, (0.0, 0.0)) if np.dtype(dtype).kind == "f" else (0.0, 0.0)


def compare(
    got: np.ndarray, reference: np.ndarray, atol: float, rtol: float
) -> tuple[float | None, float | None, bool]:
    """(max abs error, max rel error over |reference| >= atol, within tolerance) of `got` against `reference`."""
    if got.shape != reference.shape:
        return None, None, False
    ref = np.asarray(reference, dtype=np.float64)
    diff = np.abs(np.asarray(got, dtype=np.float64) - ref)
    if not diff.size:
        return 0.0, 0.0, True
    if not np.all(np.isfinite(diff)):
        same = np.array_equal(got, reference, equal_nan=True)
        return (0.0, 0.0, True) if same else (None, None, False)
    large = np.abs(ref) >= max(atol, np.finfo(np.float64).tiny)
    rel = float((diff[large] / np.abs(ref[large])).max()) if large.any() else 0.0
    return float(diff.max()), rel, bool(np.all(diff <= atol + rtol * np.abs(ref)))


def _output_checks(source: Outputs, serving: Outputs, names: list[str], table) -> tuple[list[OutputCheck], list[str]]:
    errors = []
    if len(source) != len(serving):
        errors.append(
            f"the source returns {len(source)} outputs and the serving model {len(serving)}; export the serving model from this source."
        )
    checks = []
    for i, (ref, got) in enumerate(zip(source, serving)):
        atol, rtol = _tolerance(table, ref.dtype)
        max_abs, max_rel, ok = compare(got, ref, atol, rtol)
        reason = (
            "" if got.shape == ref.shape else f"shape {list(got.shape)} in serving, {list(ref.shape)} in the source"
        )
        name = names[i] if i < len(names) else f"output_{i}"
        checks.append(
            OutputCheck(
                name=name,
                shape=list(ref.shape),
                dtype=ref.dtype.name,
                max_abs_error=max_abs,
                max_rel_error=max_rel,
                atol=atol,
                rtol=rtol,
                passed=ok,
                reason=reason,
            )
        )
    return checks, errors


#: Why batch independence could not be tested on a one-request sample, and what makes it testable.
SINGLE_REQUEST = (
    "the sample has a single request, so no request can be compared with others in its batch; pass a sample of at "
    "least two, or, for a program traced at batch size 1 (a static batch), export it with a dynamic batch "
    "(torch.export.export(..., dynamic_shapes=...) with a torch.export.Dim on axis 0)"
)


def _companion(sample: Sample, i: int) -> tuple[np.ndarray, ...]:
    """A batch of the sample's size with request i at row i and different requests (the others, shifted) elsewhere."""
    n = sample.batch_size
    order = [i if j == i else (j + 1) % n for j in range(n)]
    return tuple(a[order] for a in sample.arrays)


def batch_independence(side: str, run: ModelRunner, sample: Sample, full: Outputs, table) -> BatchIndependenceCheck:
    """Each request alone (or among different requests, for a fixed batch size) against its row in `full`."""
    n = sample.batch_size
    again = run(sample.arrays)
    deterministic = len(again) == len(full) and all(np.array_equal(a, b, equal_nan=True) for a, b in zip(again, full))
    if n < 2:
        return BatchIndependenceCheck(
            side=side,
            method="skipped",
            requests=n,
            max_abs_difference=None,
            max_rel_difference=None,
            deterministic=deterministic,
            passed=deterministic,
            reason=SINGLE_REQUEST,
        )
    method = "alone"
    try:
        singles = [run(sample.rows(i)) for i in range(n)]
    except Exception:  # a fixed batch size (static export) refuses a batch of one: keep the size, change the neighbours
        method = "replaced"
        try:
            singles = [[o[i : i + 1] for o in run(_companion(sample, i))] for i in range(n)]
        except Exception as error:  # neither a batch of one nor a reordered batch runs: report, do not crash
            return BatchIndependenceCheck(
                side=side,
                method="skipped",
                requests=n,
                max_abs_difference=None,
                max_rel_difference=None,
                deterministic=deterministic,
                passed=False,
                reason=f"the model refused both a batch of one and a reordered batch ({type(error).__name__})",
            )
    worst_abs, worst_rel, passed = 0.0, 0.0, deterministic
    for i, outputs in enumerate(singles):
        for ref, got in zip(full, outputs):
            atol, rtol = _tolerance(table, ref.dtype)
            max_abs, max_rel, ok = compare(got, ref[i : i + 1], atol, rtol)
            passed &= ok
            worst_abs = None if max_abs is None or worst_abs is None else max(worst_abs, max_abs)
            worst_rel = None if max_rel is None or worst_rel is None else max(worst_rel, max_rel)
    reason = (
        ""
        if deterministic
        else "the same batch run twice gave different outputs (random ops, e.g. dropout in training mode)"
    )
    if not passed and deterministic:
        reason = "a request's output changes with the other requests in its batch (a layer normalizing with batch statistics)"
    return BatchIndependenceCheck(
        side=side,
        method=method,
        requests=n,
        max_abs_difference=worst_abs,
        max_rel_difference=worst_rel,
        deterministic=deterministic,
        passed=bool(passed),
        reason=reason,
    )


def contract_test(
    source: Any,
    serving: Any,
    sample: Any = None,
    tolerances: Any = None,
    *,
    batch_size: int = DEFAULT_BATCH,
    seed: int = DEFAULT_SEED,
    optimized_runtime: bool = False,
    diagnose: bool = True,
) -> ContractResult:
    """Replay one sample through the source (eval) and the serving ONNX model (onnxruntime);
    compare outputs and batch independence.

    Args:
        source: torch.nn.Module, torch ExportedProgram or keras.Model (or a .pt2/.keras path).
        serving: onnx.ModelProto (or an .onnx path).
        sample: None (seeded random for the models' input shape), a .npy/.npz path, arrays, or a Sample.
        tolerances: None (DEFAULT_TOLERANCES), {dtype: (atol, rtol)} overrides, or one (atol, rtol).
        optimized_runtime: run onnxruntime with its default graph optimizations instead of the graph as written.
        diagnose: when an output differs, name it and every normalization setting of the serving graph that differs
            from its source layer (`diagnosis.mismatch_findings`).
    """
    table = resolve_tolerances(tolerances)
    source, serving = (load_model(m) if isinstance(m, (str, Path)) else m for m in (source, serving))
    src = source_runner(source)
    srv = serving_runner(serving, optimized=optimized_runtime)
    specs = merge_specs(src.specs, srv.specs)
    sample = as_sample(sample, specs, batch_size, seed)
    errors: list[str] = []
    try:
        source_out = src(sample.arrays)
    except Exception as error:
        raise InputFileError(
            f"the source model refused the sample ({sample.description}): {type(error).__name__}: {str(error).strip()[:300]}"
        ) from error
    try:
        serving_out = srv(sample.arrays)
    except Exception as error:
        raise InputFileError(
            f"onnxruntime refused the sample ({sample.description}): {str(error).strip().splitlines()[0][:300]}"
        ) from error
    outputs, output_errors = _output_checks(source_out, serving_out, srv.output_names or [], table)
    errors += output_errors
    independence = [
        batch_independence("source", src, sample, source_out, table),
        batch_independence("serving", srv, sample, serving_out, table),
    ]
    diagnosis, differing = mismatch_findings(source, serving, sample, outputs) if diagnose else ([], [])
    used = sorted({np.dtype(o.dtype).name for o in outputs} & set(table)) or ["float32"]
    passed = not errors and all(o.passed for o in outputs) and all(b.passed for b in independence)
    return ContractResult(
        source=src.description,
        serving=srv.description,
        runtime=srv.runtime,
        sample=SampleInfo(
            description=sample.description,
            shapes=[list(a.shape) for a in sample.arrays],
            dtypes=[a.dtype.name for a in sample.arrays],
            seed=sample.seed,
            path=sample.path,
        ),
        tolerances=[Tolerance(dtype=d, atol=table[d][0], rtol=table[d][1]) for d in used],
        outputs=outputs,
        batch_independence=independence,
        findings=src.findings + srv.findings + diagnosis,
        differing_settings=differing,
        errors=errors,
        passed=passed,
    )
