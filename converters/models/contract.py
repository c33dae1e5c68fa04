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

import copy
from collections.abc import Callable, Sequence
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

from .loading import framework_of_model, load_model
from .samples import (
    DEFAULT_BATCH,
    DEFAULT_SEED,
    InputSpec,
    Sample,
    as_sample,
    input_specs,
    merge_specs,
)

#: (atol, rtol) per output dtype for a whole model: |serving - source| <= atol + rtol * |source|.
#: Looser than one layer's (converters.equivalence.TOLERANCES): a network accumulates float32
#: reordering through every Conv and MatMul, and exporters fuse or reorder ops.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {"float16": (1e-2, 1e-2), "float32": (1e-4, 1e-3), "float64": (1e-8, 1e-7)}

Outputs = list[np.ndarray]


class ModelRunner:
    """A model as a function from a tuple of input arrays to a list of output arrays."""

    def __init__(self, run: Callable[[Sequence[np.ndarray]], Outputs], description: str, specs: list[InputSpec],
                 findings: list[str] | None = None, output_names: list[str] | None = None, runtime: str = ""):
        self.run, self.description, self.specs = run, description, specs
        self.findings = findings or []
        self.output_names = output_names
        self.runtime = runtime

    def __call__(self, arrays: Sequence[np.ndarray]) -> Outputs:
        return [np.asarray(o) for o in self.run(arrays)]


# --------------------------------------------------------------------------- source side


def source_runner(source: Any) -> ModelRunner:
    """Runner for a torch nn.Module (deep copy in eval), an ExportedProgram or a Keras model (training=False)."""
    if isinstance(source, (str, Path)):
        source = load_model(source)
    framework = framework_of_model(source)
    if framework == "keras":
        return _keras_runner(source)
    if framework == "torch":
        import torch

        if isinstance(source, torch.export.ExportedProgram):
            return _program_runner(source)
        if isinstance(source, torch.nn.Module):
            return _module_runner(source)
    raise InputFileError(f"the source must be a torch.nn.Module, a torch ExportedProgram (.pt2) or a Keras model (.keras); got a {type(source).__name__}.")


def _flatten(value: Any) -> Outputs:
    """Model outputs as a flat list: tensors, and tuples, lists or dicts of them, in order."""
    if isinstance(value, dict):
        return [a for v in value.values() for a in _flatten(v)]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _flatten(v)]
    if hasattr(value, "detach"):
        return [value.detach().cpu().numpy()]
    return [np.asarray(value)]


def _module_runner(module) -> ModelRunner:
    import torch

    served = copy.deepcopy(module).eval()
    mode_dependent = (torch.nn.modules.batchnorm._NormBase, torch.nn.modules.dropout._DropoutNd)
    in_train = [f"{type(m).__name__} '{name or type(m).__name__}'" for name, m in module.named_modules() if m.training and isinstance(m, mode_dependent)]
    findings = []
    if in_train:
        shown = ", ".join(in_train[:4]) + (f" and {len(in_train) - 4} more" if len(in_train) > 4 else "")
        findings.append(f"source module is in train mode ({shown}); the contract replays a deep copy in eval mode, which is what serving must compute")

    def run(arrays):
        with torch.no_grad():
            return _flatten(served(*[torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]))

    return ModelRunner(run, f"torch {type(module).__name__} (deep copy in eval mode)", [], findings)


def exported_program_train_ops(program) -> list[str]:
    """Nodes of an ExportedProgram that compute in train mode (batch statistics, active dropout).

    A module exported while in `.train()` keeps `training=True` in its graph; an ExportedProgram
    cannot be switched to eval (`.module().eval()` raises NotImplementedError in torch 2.x).
    """
    from torch.fx.operator_schemas import normalize_function

    found = []
    for node in program.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        if not any(word in schema.name for word in ("batch_norm", "dropout")):
            continue
        normalized = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
        kwargs = normalized.kwargs if normalized else {}
        flag = kwargs.get("training", kwargs.get("train"))
        if flag is True:
            found.append(f"'{node.name}' ({schema.name} with {'training' if 'training' in kwargs else 'train'}=True)")
    return found


def _program_runner(program) -> ModelRunner:
    import torch

    module = program.module()
    train_ops = exported_program_train_ops(program)
    findings = []
    if train_ops:
        findings.append(
            f"source ExportedProgram computes in train mode at {', '.join(train_ops)}: it was exported from a module in .train() and "
            "cannot be switched to eval; export the module again after .eval()"
        )

    def run(arrays):
        with torch.no_grad():
            return _flatten(module(*[torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]))

    return ModelRunner(run, "torch ExportedProgram (as traced)", input_specs(program), findings)


def _keras_runner(model) -> ModelRunner:
    from converters.keras_adapter.common import import_keras

    keras = import_keras()
    specs = input_specs(model)

    def run(arrays):
        inputs = arrays[0] if len(arrays) == 1 else list(arrays)
        return [keras.ops.convert_to_numpy(o) for o in _flatten_keras(model(inputs, training=False))]

    return ModelRunner(run, f"keras {type(model).__name__} '{model.name}' (training=False)", specs)


def _flatten_keras(value: Any) -> list:
    if isinstance(value, dict):
        return [a for v in value.values() for a in _flatten_keras(v)]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _flatten_keras(v)]
    return [value]


# --------------------------------------------------------------------------- serving side


def onnx_train_mode_nodes(model) -> list[str]:
    """BatchNormalization nodes with training_mode=1 and Dropout nodes whose training_mode input is a true constant."""
    from onnx import helper, numpy_helper

    constants = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    found = []
    for node in model.graph.node:
        name = node.name or node.output[0]
        if node.op_type == "BatchNormalization":
            mode = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "training_mode"), 0)
            if mode:
                found.append(f"BatchNormalization '{name}' has training_mode=1 (normalizes with batch statistics)")
        elif node.op_type == "Dropout" and len(node.input) > 2 and node.input[2] in constants and _true(numpy_helper.to_array(constants[node.input[2]])):
            found.append(f"Dropout '{name}' has training_mode=1 (drops activations at random when run as written)")
    return found


def _true(value: np.ndarray) -> bool:
    return bool(np.asarray(value).reshape(-1)[0])


def serving_runner(model: Any, optimized: bool = False) -> ModelRunner:
    """Runner for an onnx.ModelProto (or .onnx path) on onnxruntime's CPU provider, as written unless `optimized`."""
    import onnxruntime

    if isinstance(model, (str, Path)):
        model = load_model(model)
    if framework_of_model(model) != "onnx":
        raise InputFileError(f"the serving model must be an ONNX model (.onnx); got a {type(model).__name__}.")
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if not optimized:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own Fail/InvalidGraph types
        raise InputFileError(f"onnxruntime cannot load the serving model ({str(error).strip().splitlines()[0]}); check the opset and ops it uses.") from error
    names = [i.name for i in session.get_inputs()]

    def run(arrays):
        return session.run(None, dict(zip(names, arrays)))

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    graph = model.graph.name or "graph"
    runtime = f"onnxruntime {onnxruntime.__version__} CPU, graph optimizations {'enabled' if optimized else 'disabled (graph as written)'}"
    return ModelRunner(run, f"onnx '{graph}' opset {opset}, {len(model.graph.node)} nodes", input_specs(model),
                       onnx_train_mode_nodes(model), [o.name for o in session.get_outputs()], runtime)


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


def compare(got: np.ndarray, reference: np.ndarray, atol: float, rtol: float) -> tuple[float | None, float | None, bool]:
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
        errors.append(f"the source returns {len(source)} outputs and the serving model {len(serving)}; export the serving model from this source.")
    checks = []
    for i, (ref, got) in enumerate(zip(source, serving)):
        atol, rtol = _tolerance(table, ref.dtype)
        max_abs, max_rel, ok = compare(got, ref, atol, rtol)
        reason = "" if got.shape == ref.shape else f"shape {list(got.shape)} in serving, {list(ref.shape)} in the source"
        name = names[i] if i < len(names) else f"output_{i}"
        checks.append(OutputCheck(name=name, shape=list(ref.shape), dtype=ref.dtype.name, max_abs_error=max_abs, max_rel_error=max_rel,
                                  atol=atol, rtol=rtol, passed=ok, reason=reason))
    return checks, errors


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
        return BatchIndependenceCheck(side=side, method="skipped", requests=n, max_abs_difference=None, max_rel_difference=None,
                                      deterministic=deterministic, passed=deterministic, reason="the sample has a single request; pass at least two")
    method = "alone"
    try:
        singles = [run(sample.rows(i)) for i in range(n)]
    except Exception:  # a fixed batch size (static export) refuses a batch of one: keep the size, change the neighbours
        method = "replaced"
        try:
            singles = [[o[i : i + 1] for o in run(_companion(sample, i))] for i in range(n)]
        except Exception as error:  # neither a batch of one nor a reordered batch runs: report, do not crash
            return BatchIndependenceCheck(side=side, method="skipped", requests=n, max_abs_difference=None, max_rel_difference=None,
                                          deterministic=deterministic, passed=False,
                                          reason=f"the model refused both a batch of one and a reordered batch ({type(error).__name__})")
    worst_abs, worst_rel, passed = 0.0, 0.0, deterministic
    for i, outputs in enumerate(singles):
        for ref, got in zip(full, outputs):
            atol, rtol = _tolerance(table, ref.dtype)
            max_abs, max_rel, ok = compare(got, ref[i : i + 1], atol, rtol)
            passed &= ok
            worst_abs = None if max_abs is None or worst_abs is None else max(worst_abs, max_abs)
            worst_rel = None if max_rel is None or worst_rel is None else max(worst_rel, max_rel)
    reason = "" if deterministic else "the same batch run twice gave different outputs (random ops, e.g. dropout in training mode)"
    if not passed and deterministic:
        reason = "a request's output changes with the other requests in its batch (a layer normalizing with batch statistics)"
    return BatchIndependenceCheck(side=side, method=method, requests=n, max_abs_difference=worst_abs, max_rel_difference=worst_rel,
                                  deterministic=deterministic, passed=bool(passed), reason=reason)


def contract_test(source: Any, serving: Any, sample: Any = None, tolerances: Any = None, *,
                  batch_size: int = DEFAULT_BATCH, seed: int = DEFAULT_SEED, optimized_runtime: bool = False) -> ContractResult:
    """Replay one sample through the source (eval) and the serving ONNX model (onnxruntime); compare outputs and batch independence.

    Args:
        source: torch.nn.Module, torch ExportedProgram or keras.Model (or a .pt2/.keras path).
        serving: onnx.ModelProto (or an .onnx path).
        sample: None (seeded random for the models' input shape), a .npy/.npz path, arrays, or a Sample.
        tolerances: None (DEFAULT_TOLERANCES), {dtype: (atol, rtol)} overrides, or one (atol, rtol).
        optimized_runtime: run onnxruntime with its default graph optimizations instead of the graph as written.
    """
    table = resolve_tolerances(tolerances)
    src = source_runner(source)
    srv = serving_runner(serving, optimized=optimized_runtime)
    specs = merge_specs(src.specs, srv.specs)
    sample = as_sample(sample, specs, batch_size, seed)
    errors: list[str] = []
    try:
        source_out = src(sample.arrays)
    except Exception as error:
        raise InputFileError(f"the source model refused the sample ({sample.description}): {type(error).__name__}: {str(error).strip()[:300]}") from error
    try:
        serving_out = srv(sample.arrays)
    except Exception as error:
        raise InputFileError(f"onnxruntime refused the sample ({sample.description}): {str(error).strip().splitlines()[0][:300]}") from error
    outputs, output_errors = _output_checks(source_out, serving_out, srv.output_names or [], table)
    errors += output_errors
    independence = [batch_independence("source", src, sample, source_out, table), batch_independence("serving", srv, sample, serving_out, table)]
    used = sorted({np.dtype(o.dtype).name for o in outputs} & set(table)) or ["float32"]
    passed = not errors and all(o.passed for o in outputs) and all(b.passed for b in independence)
    return ContractResult(
        source=src.description,
        serving=srv.description,
        runtime=srv.runtime,
        sample=SampleInfo(description=sample.description, shapes=[list(a.shape) for a in sample.arrays], dtypes=[a.dtype.name for a in sample.arrays],
                          seed=sample.seed, path=sample.path),
        tolerances=[Tolerance(dtype=d, atol=table[d][0], rtol=table[d][1]) for d in used],
        outputs=outputs,
        batch_independence=independence,
        findings=src.findings + srv.findings,
        errors=errors,
        passed=passed,
    )
