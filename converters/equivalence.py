"""The equivalence check: convert to every framework and back, compare specs, outputs and one training step.

The NumPy reference is the judge; frameworks are never only compared with each other.
The registry runs this on every registration.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Iterable

import numpy as np

from schemas import (
    CheckResult,
    NormSpec,
    NormbridgeError,
    NotExpressibleError,
    OutputComparison,
    StatsComparison,
    TargetCheck,
    spec_differences,
)

from schemas.floats import as_float32
from schemas.tensors import tensors_identical

from . import reference
from .api import read_spec, target_spec_of, write_spec
from .gate import round_trips
from .layout import from_channels_first, to_channels_first
from .options import ConversionOptions
from .probe import probe_input
from .adapters import REGISTRY, AdapterRegistry

#: bfloat16's machine epsilon 2**-7 (8 significant bits): one ulp of a value in [1, 2).
BF16_ULP = 2.0**-7
#: (atol, rtol) per dtype: |out - ref| <= atol + rtol * |ref| elementwise. bfloat16: 2 ulps. The reference
#: (reference/precision.py) and a framework both round each intermediate (statistics, normalised value, scale
#: product, bias sum) once; where they round differently (float32 or bf16 statistics, the cast before or after
#: the affine) each of the two disagreeing roundings moves the output by at most half an ulp of the largest
#: intermediate, so 2 ulps of max(1, max |reference|) bound it (measured: at most 1.05 ulps on the case table);
#: atol is scaled by that maximum in output_tolerances, since a bias can cancel a product near zero.
TOLERANCES: dict[str, tuple[float, float]] = {
    "bfloat16": (2 * BF16_ULP, 2 * BF16_ULP),
    "float16": (2e-2, 2e-2),
    "float32": (1e-5, 1e-4),
    "float64": (1e-10, 1e-9),
}
#: Fields that may differ after going to another framework and back to the source one: provenance,
#: and the layout, because every conversion produces the target's natural layer (a Keras axis=1
#: layer comes back as the natural channels-last one; the data layout is reported, not kept).
ROUND_TRIP_IGNORED = ("source", "input_rank", "layout")


def output_tolerances(framework, spec: NormSpec, reference_max: float = 0.0) -> tuple[float, float]:
    """(atol, rtol) for eval outputs of `spec` run in `framework`; `reference_max` is max |reference output|.

    Where eps is a float32 attribute (ONNX) a float64 layer runs with float32(eps): the
    normalised values move by at most |eps - float32(eps)| / (2 * eps) relative, which is
    added to rtol and, scaled by the largest output, to atol (an output near zero after the
    bias can carry that error too).
    """
    atol, rtol = TOLERANCES[spec.dtype]
    if spec.dtype == "bfloat16":
        atol *= max(1.0, reference_max)
    if framework is not None and framework.float32_attributes and spec.dtype == "float64":
        extra = abs(spec.eps - as_float32(spec.eps)) / (2.0 * spec.eps)
        rtol += extra
        atol += extra * reference_max
    return atol, rtol


def _errors(
    out: np.ndarray, ref: np.ndarray, dtype: str, tolerances: tuple[float, float] | None = None
) -> tuple[float, float, bool]:
    atol, rtol = tolerances or TOLERANCES[dtype]
    out = np.asarray(out, dtype=np.float64)
    if out.shape != ref.shape:
        return float("inf"), float("inf"), False
    diff = np.abs(out - ref)
    if not diff.size:
        return 0.0, 0.0, True
    magnitude = np.abs(ref)
    if magnitude.dtype != np.float64:
        return (
            float(diff.max()),
            float((diff / np.maximum(magnitude, _TINY)).max()),
            bool((diff <= atol + rtol * magnitude).all()),
        )
    # The same operations in place (a float64 reference, as every check's): no temporaries.
    bound = np.multiply(magnitude, rtol)
    np.add(bound, atol, out=bound)
    within = bool(np.less_equal(diff, bound).all())
    np.maximum(magnitude, _TINY, out=magnitude)
    np.divide(diff, magnitude, out=magnitude)
    return float(diff.max()), float(magnitude.max()), within


_TINY = np.finfo(np.float64).tiny


def _runtime_unavailable(error: Exception) -> bool:
    """onnxruntime lacks some kernels (float64 InstanceNormalization): that is not a conversion failure."""
    return "NOT_IMPLEMENTED" in str(error)


def _check_training_step(
    spec: NormSpec,
    target_spec: NormSpec,
    framework,
    obj,
    x_cf: np.ndarray,
    dtype: str,
    source: Callable[[], reference.TrainStep],
    objects: "CheckObjects",
) -> StatsComparison:
    """`source()` is reference.train_step(spec, x_cf): the same for every target,
    so check() computes it at most once."""
    x = from_channels_first(x_cf, target_spec.layout)
    y, mean, var = objects.run_train_step(framework, obj, x)
    # The reference is a function of the spec's settings and tensors: a target read back with the source's own (the
    # torch target of a torch layer) predicts the source's step, computed once.
    expected = None if _computes_as(target_spec, spec) else reference.train_step(target_spec, x_cf)
    source_step = source()
    if expected is None:
        expected = source_step
    err_mean = float(np.max(np.abs(mean - expected.running_mean)))
    err_var = float(np.max(np.abs(var - expected.running_var)))
    gap = (
        0.0
        if target_spec.variance_estimator == spec.variance_estimator
        else float(np.max(np.abs(expected.running_var - source_step.running_var)))
    )
    observed = float(np.max(np.abs(var - source_step.running_var)))
    y_ref = source_step.output  # the source layer's training-mode output
    _, _, y_ok = _errors(
        to_channels_first(y, target_spec.layout),
        y_ref,
        dtype,
        output_tolerances(framework, spec, float(np.max(np.abs(y_ref)))),
    )
    tol_mean, tol_var = training_tolerances(framework, target_spec, x_cf, expected)
    passed = y_ok and err_mean <= tol_mean and err_var <= tol_var and observed <= gap + tol_var
    return StatsComparison(
        framework=framework.name,
        variance_estimator=target_spec.variance_estimator or "",
        max_abs_error_mean=err_mean,
        max_abs_error_var=err_var,
        expected_var_difference_vs_source=gap,
        observed_var_difference_vs_source=observed,
        passed=passed,
    )


def _computes_as(a: NormSpec, b: NormSpec) -> bool:
    """Whether every field but the name and the provenance is the same value (a float's sign too) and every tensor the
    same bits: then the reference computes the same for both."""
    for field in type(a).model_fields:
        if field in ("name", "source", "tensors"):
            continue
        left, right = getattr(a, field), getattr(b, field)
        if (
            type(left) is not type(right)
            or left != right
            or (isinstance(left, float) and math.copysign(1.0, left) != math.copysign(1.0, right))
        ):
            return False
    return a.tensors.keys() == b.tensors.keys() and all(
        tensors_identical(a.tensors[n], b.tensors[n]) for n in a.tensors
    )


def training_tolerances(
    framework, target_spec: NormSpec, x_cf: np.ndarray, expected: reference.TrainStep | None = None
) -> tuple[float, float]:
    """Allowed max abs error of (running_mean, running_var) after one step of `target_spec` on `x_cf`
    (`expected`: that step, if known)."""
    atol, rtol = TOLERANCES[target_spec.dtype]
    expected = expected or reference.train_step(target_spec, x_cf)
    tol_mean = atol + rtol * float(np.max(np.abs(expected.running_mean)))
    tol_var = atol + rtol * float(np.max(np.abs(expected.running_var)))
    if framework.float32_attributes and target_spec.momentum is not None:
        # The runtime updates with float32(momentum): allow |m - float32(m)| * |batch - running|.
        rounding = max(
            abs(m - as_float32(m)) for m in (target_spec.momentum_as(c) for c in ("batch_weight", "running_weight"))
        )
        old_mean, old_var = (target_spec.tensors[n].astype(np.float64) for n in ("running_mean", "running_var"))
        batch_mean, batch_var, count = reference.batch_moments(target_spec, x_cf)
        batch_var = batch_var * count / max(count - 1, 1)  # the larger of the two estimators bounds both
        tol_mean += rounding * float(np.max(np.abs(batch_mean - old_mean)))
        tol_var += rounding * float(np.max(np.abs(batch_var - old_var)))
    return tol_mean, tol_var


def _back_to_source(
    spec: NormSpec, target_spec: NormSpec, source: str, options: ConversionOptions, objects: "CheckObjects"
) -> tuple[NormSpec, NormSpec | None]:
    """(the spec read back after converting `target_spec` to the source framework, the spec it must equal or None for
    the expressed one). Into the stock class first; where no stock class holds the layer (a channels-first LayerNorm in
    torch), into the class the source was read from, rebuilt with the source's provenance (torch_adapter/restoring.py):
    then the round trip must give the source spec itself."""
    registry = objects.registry
    try:
        return objects.read(objects.write_back(target_spec, source, options)), None
    except NotExpressibleError as refused:
        if not spec.source.module_class:
            raise
        layer, how = registry.framework(source).restore(target_spec.replace(source=spec.source))
        if layer is None:
            raise NotExpressibleError(
                f"no stock {source} class holds {refused.setting}, and its own class "
                f"{spec.source.module_class} was not rebuilt: {how}",
                layer=spec.name,
                setting=refused.setting or "class",
                target=source,
            ) from refused
        return objects.read(layer), spec


def round_trip_options(spec: NormSpec, options: ConversionOptions) -> ConversionOptions:
    """The options a target's layer is written back to the source framework with (`options`: the target's)."""
    if spec.source.framework == "onnx" and spec.training:
        # The source graph itself had training_mode=1: writing it back that way is the faithful round trip.
        return options.model_copy(update={"onnx_training_mode": True})
    return options


def round_trip_differences(
    spec: NormSpec, target_spec: NormSpec, expressed: NormSpec, options: ConversionOptions, objects: "CheckObjects"
) -> list[str]:
    """How the layer read from a target (`target_spec`), written back to the source framework and read again, differs
    from the spec it must equal (`expressed`, or the source spec itself where the source class was rebuilt). `options`:
    the target's. Raises NotExpressibleError where the source framework cannot hold it."""
    back_spec, home = _back_to_source(
        spec, target_spec, spec.source.framework, round_trip_options(spec, options), objects
    )
    return [str(d) for d in spec_differences(home or expressed, back_spec, ignore=ROUND_TRIP_IGNORED)]


def _check_target(
    spec: NormSpec,
    target: str,
    options: ConversionOptions,
    x_cf: np.ndarray,
    y_ref: np.ndarray,
    result: CheckResult,
    source_step: Callable[[], reference.TrainStep],
    objects: "CheckObjects",
) -> None:
    registry = objects.registry
    framework = registry.framework(target)
    options = target_options(options)
    try:
        obj, layer_report = objects.write(spec, target, options)
    except NotExpressibleError as error:
        result.targets.append(TargetCheck(framework=target, status="not_expressible", reason=str(error)))
        return
    entry = TargetCheck(framework=target, status="passed", warnings=list(layer_report.warnings))
    result.targets.append(entry)
    target_spec = objects.read(obj)
    # A setting the target has no attribute for may be expressed in one it has (a scale offset folded into the scale):
    # the layer read back is compared with that, and its outputs, below, with the source spec's reference.
    expressed = target_spec_of(spec, target, registry)
    entry.spec_differences = [str(d) for d in spec_differences(expressed, target_spec)]
    source = spec.source.framework
    deferred = None
    if source in registry.framework_names:
        deferred = round_trips.hold(
            result, entry, target_spec, expressed
        )  # a worker leaves it to its caller, which has `source`
        if deferred is None:
            entry.round_trip_differences = round_trip_differences(spec, target_spec, expressed, options, objects)
    try:
        out = objects.run_eval(framework, obj, from_channels_first(x_cf, target_spec.layout))
    except Exception as error:  # runtimes raise their own types
        if _runtime_unavailable(error):
            entry.status, entry.reason = "skipped", f"runtime cannot evaluate it: {str(error).splitlines()[0]}"
            return
        raise
    atol, rtol = output_tolerances(framework, spec, float(np.max(np.abs(y_ref))))
    max_abs, max_rel, ok = _errors(to_channels_first(out, target_spec.layout), y_ref, spec.dtype, (atol, rtol))
    result.outputs.append(
        OutputComparison(
            framework=target, max_abs_error=max_abs, max_rel_error=max_rel, atol=atol, rtol=rtol, passed=ok
        )
    )
    if spec.track_running_stats:
        try:
            stats = _check_training_step(spec, target_spec, framework, obj, x_cf, spec.dtype, source_step, objects)
            result.training_step.append(stats)
            ok = ok and stats.passed
        except NotExpressibleError as error:
            entry.warnings.append(f"training step not checked: {error}")
    if entry.spec_differences or entry.round_trip_differences or not ok:
        entry.status = "failed"
    if deferred is not None:
        deferred.reached_end = True  # where a round trip's differences fail the target


def check(
    spec_or_obj: Any,
    frameworks: Iterable[str] | None = None,
    options: ConversionOptions | None = None,
    registry: AdapterRegistry = REGISTRY,
) -> CheckResult:
    """Convert a layer to every framework and back and check it still computes the same function.

    Checks, per target: the portable spec fields survive the trip and the round trip back
    to the source framework is exact (tensors bit-identical); eval outputs on a fixed probe
    match the NumPy reference within the dtype's tolerance; one training step moves the
    running statistics as the reference predicts, and differs from the source framework's
    step by no more than the stated estimator difference. Targets that cannot express the
    layer are listed as not_expressible with the reason, not counted as failures. `frameworks`
    defaults to every framework of the registry.
    """
    options = options or ConversionOptions()
    spec = spec_or_obj if isinstance(spec_or_obj, NormSpec) else read_spec(spec_or_obj, registry=registry)[0]
    x_cf = probe_input(spec)
    result = new_result(spec, x_cf)
    y_ref = reference.forward(spec, x_cf, training=False)
    source_step = functools.cache(
        lambda: reference.train_step(spec, x_cf)
    )  # computed by the first target that needs it
    objects = CheckObjects(registry)
    for target in registry.framework_names if frameworks is None else frameworks:
        check_target(spec, target, options, x_cf, y_ref, result, source_step, objects)
    result.passed = verdict(result)
    return result


def new_result(spec: NormSpec, x_cf: np.ndarray) -> CheckResult:
    """The result `check` fills for `spec` probed with `x_cf`: no entries yet, not passed."""
    return CheckResult(
        layer=spec.name,
        kind=spec.kind,
        source_framework=spec.source.framework,
        dtype=spec.dtype,
        passed=False,
        probe_shape=list(x_cf.shape),
    )


def check_target(
    spec: NormSpec,
    target: str,
    options: ConversionOptions,
    x_cf: np.ndarray,
    y_ref: np.ndarray,
    result: CheckResult,
    source_step: Callable[[], reference.TrainStep],
    objects: "CheckObjects",
) -> None:
    """One target's part of `check` into `result`: a NormbridgeError becomes that target's failed entry and an error
    line."""
    try:
        _check_target(spec, target, options, x_cf, y_ref, result, source_step, objects)
    except NormbridgeError as error:
        entry = result.targets[-1] if result.targets and result.targets[-1].framework == target else None
        if (
            entry is None
        ):  # the target's entry, when it was made before the failure, says it failed: one entry per target
            result.targets.append(TargetCheck(framework=target, status="failed", reason=str(error)))
        else:
            entry.status, entry.reason = "failed", str(error)
        result.errors.append(f"{target}: {error}")


@functools.lru_cache(maxsize=64)  # options are frozen and hashed by value; every target of every spec asks
def target_options(options: ConversionOptions) -> ConversionOptions:
    """The options a target is written with: every target is checked with its stock class."""
    return options.model_copy(update={"restore_source_class": False})


class CheckObjects:
    """How `check` builds, reads and runs the layers it checks: here each call is the plain one.

    `check_many` (converters/gate/grouped_check.py) passes one that builds a layer once per configuration and reuses it;
    everything `check` concludes from what these calls return is the same code for both.
    """

    def __init__(self, registry: AdapterRegistry):
        self.registry = registry

    def write(self, spec: NormSpec, target: str, options: ConversionOptions) -> tuple[Any, Any]:
        """(the target's layer for `spec`, its LayerReport)."""
        return write_spec(spec, target, options, registry=self.registry)

    def write_back(self, spec: NormSpec, source: str, options: ConversionOptions) -> Any:
        """The layer a spec read from a target becomes in the source framework (the round trip)."""
        return write_spec(spec, source, options, registry=self.registry)[0]

    def read(self, obj: Any) -> NormSpec:
        return read_spec(obj, registry=self.registry)[0]

    def run_eval(self, framework, obj: Any, x: np.ndarray) -> np.ndarray:
        return framework.run_eval(obj, x)

    def run_train_step(self, framework, obj: Any, x: np.ndarray):
        return framework.run_train_step(obj, x)


def verdict(result: CheckResult) -> bool:
    """Whether a check passed: no error, no failed target, every output and training step within tolerance,
    one target passed."""
    return (
        not result.errors
        and all(t.status != "failed" for t in result.targets)
        and all(o.passed for o in result.outputs)
        and all(s.passed for s in result.training_step)
        and any(t.status == "passed" for t in result.targets)
    )
