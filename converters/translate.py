"""Shared translation rules: how eps, momentum, estimator, layout and mode move between frameworks.

Adapters call these so that every framework reports (and refuses) the same way.
"""

from __future__ import annotations

from schemas import LayerReport, NormSpec, NotExpressibleError
from schemas.floats import as_float32

from .adapters import REGISTRY
from .options import ConversionOptions


def record_eps(report: LayerReport, spec: NormSpec, *, float32_attribute: bool = False) -> float:
    """Record how eps is carried; return the value to write (always the source's, never a default)."""
    origin = " (PyTorch eps=None: the eps of the dtype it computes in)" if spec.eps_origin == "dtype_eps" else ""
    if float32_attribute and as_float32(spec.eps) != spec.eps:
        report.add(
            "eps",
            spec.eps,
            as_float32(spec.eps),
            "stored",
            f"float32 attribute; read back as the shortest decimal {spec.eps!r}{origin}",
        )
    else:
        report.add("eps", spec.eps, note=origin.strip(" ()"))
    return spec.eps


def emit_momentum(
    report: LayerReport, spec: NormSpec, convention: str, options: ConversionOptions, target: str
) -> float | None:
    """The momentum to write in the target's `convention`, recorded; handles momentum=None."""
    if spec.momentum is None and spec.track_running_stats:
        if options.cumulative_momentum == "error":
            raise NotExpressibleError(
                f"momentum=None (cumulative moving average over num_batches_tracked) has no {target} equivalent; "
                "pass cumulative_momentum='next_step' to emit the momentum that matches the next training step only.",
                layer=spec.name,
                setting="momentum",
                target=target,
            )
        tracked = int(spec.tensors["num_batches_tracked"])
        batch_weight = 1.0 / (tracked + 1)
        value = batch_weight if convention == "batch_weight" else 1.0 - batch_weight
        report.add(
            "momentum",
            None,
            value,
            "approximate",
            f"cumulative average replaced by 1/(num_batches_tracked+1) = 1/{tracked + 1} ({convention})",
        )
        report.warn(
            f"momentum=None (cumulative average) emitted as momentum {value!r} ({convention}): exact for the next training step only; later steps differ."
        )
        return value
    if spec.momentum is None:
        return None
    value = spec.momentum_as(convention)
    if convention == spec.momentum_convention:
        report.add("momentum", spec.momentum, note=convention)
    else:
        report.add(
            "momentum",
            spec.momentum,
            value,
            "translated",
            f"{spec.momentum_convention} -> {convention} (decimal complement)",
        )
    return value


def estimator_matches(
    report: LayerReport,
    spec: NormSpec,
    target_estimator: str,
    target: str,
    *,
    can_match: bool,
    options: ConversionOptions,
) -> str:
    """Decide which running-variance estimator the target uses and report a difference.

    Returns the estimator the emitted layer will use.
    """
    if not spec.track_running_stats or spec.variance_estimator is None:
        return target_estimator
    source = spec.variance_estimator
    if source == target_estimator:
        report.add("variance_estimator", source)
        return source
    if options.match_variance_estimator and can_match:
        report.add(
            "variance_estimator",
            source,
            source,
            "exact",
            f"emitted a {target} subclass that updates running_var with the {source} estimator",
        )
        return source
    report.add(
        "variance_estimator",
        source,
        target_estimator,
        "approximate",
        "running_var update uses a different batch-variance estimator",
    )
    factor = "n/(n-1)" if source == "biased" else "(n-1)/n"
    hint = " pass match_variance_estimator=True to make them identical." if can_match else ""
    report.warn(
        f"one training step moves running_var differently: the source uses the {source} batch variance, {target} the {target_estimator} one "
        f"(the batch term differs by {factor}, n = elements per channel in the batch; difference = momentum * batch_var / (n-1)).{hint}"
    )
    return target_estimator


def warn_empty_batch(report: LayerReport, spec: NormSpec, target: str) -> None:
    """Warn that the target's training step on an empty batch does not do what torch's does
    (nothing: it keeps its statistics).

    Each framework's behaviour is its `FrameworkInfo.empty_batch` (checked: tests/converters/test_dtypes.py)."""
    done, torch_done = REGISTRY.info(target).empty_batch, REGISTRY.info("torch").empty_batch
    if not spec.track_running_stats or spec.frozen or done == torch_done:
        return
    report.warn(
        f"a training step on an empty batch {done} in {target}, where PyTorch {torch_done}: "
        "skip empty batches when training the converted layer."
    )


def record_layout(report: LayerReport, spec: NormSpec, target_layout: str | None) -> None:
    """Channel-kind layers: the target's natural layout (the data must be transposed to match)."""
    if spec.layout is None or target_layout is None:
        return
    if spec.layout == target_layout:
        report.add("layout", spec.layout)
    else:
        report.add(
            "layout",
            spec.layout,
            target_layout,
            "translated",
            "natural layout of the target; transpose inputs accordingly",
        )


def tensor_fate(report: LayerReport, spec: NormSpec, names=("scale", "bias", "running_mean", "running_var")) -> None:
    """Record that the listed state tensors are carried bit-identically."""
    for name in names:
        if name in spec.tensors:
            array = spec.tensors[name]
            report.add(name, f"{array.dtype}{list(array.shape)}", note="bit-identical")
