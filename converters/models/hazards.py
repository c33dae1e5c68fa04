"""The hazards `inspect` detects in a layer, one function each, listed explicitly in LAYER_HAZARDS.

A hazard reads `LayerFacts` (what inspection found, whatever the framework) and returns a `Hazard` or None; hazards of a
model as a whole come from its model adapter (`model_hazards`). Severities: outputs that depend on the batch are errors;
state that looks untrained or can no longer be checked is a warning; settings that are unusual but may be intended are
info.
"""

from __future__ import annotations

import math
from typing import Callable

import ml_dtypes
import numpy as np

from schemas.floats import as_float32
from schemas.inspection import Hazard
from schemas.kinds import KIND_INFO

from ..adapters import REGISTRY
from ..model_values import LayerFacts
from .monitoring.convergence import INITIAL_WEIGHT_FLOOR, initial_weight, is_initial

#: Exporter (a site's origin) -> the framework whose defaults its layers were written with.
EXPORTER_FRAMEWORKS = {"torch.onnx": "torch", "tf2onnx": "keras"}

EXPORTERS = {
    "torch.onnx": "torch.onnx.export",
    "tf2onnx": "tf2onnx (Keras model.export)",
    "normbridge": "normbridge (below the native opset)",
    "exported_program": "torch.export's run_decompositions",
}


def _hazard(code: str, severity: str, message: str) -> Hazard:
    return Hazard(code=code, severity=severity, message=message)


# -- layer hazards ---------------------------------------------------------------------


def unreadable(facts: LayerFacts) -> Hazard | None:
    """The layer was found but its settings or state could not be read into a spec."""
    if facts.problem is None:
        return None
    return _hazard(
        "unreadable", "warning", f"{facts.layer_type} could not be read, so its settings are unchecked: {facts.problem}"
    )


def train_mode(facts: LayerFacts) -> Hazard | None:
    """A BatchNorm or InstanceNorm with running statistics in train mode: outputs depend on the batch and statistics
    move.

    An untracked BatchNorm uses batch statistics in either mode: batch_stats_at_eval reports it.
    """
    if not facts.training or not KIND_INFO[facts.kind].running_stats or not facts.tracked:
        return None
    if facts.origin == "exported_program":
        how, fix = "was exported in train mode (its op has training=True)", "call model.eval() and export again"
    else:
        how, fix = REGISTRY.model_adapter(facts.framework).train_mode_wording
    return _hazard(
        "train_mode",
        "error",
        f"{facts.layer_type} {how}: it normalises with the statistics of the current batch, so one request's output depends on the "
        f"others in its batch and every call moves the running statistics; {fix}.",
    )


def batch_stats_at_eval(facts: LayerFacts) -> Hazard | None:
    """A BatchNorm without running statistics uses batch statistics at eval too.

    An untracked InstanceNorm is not flagged: its statistics are per sample, so its output does
    not depend on the other samples of the batch.
    """
    if facts.kind != "batch" or facts.spec is None or facts.spec.track_running_stats:
        return None
    return _hazard(
        "batch_stats_at_eval",
        "error",
        f"{facts.layer_type} has track_running_stats=False: it normalises with the statistics of the current batch even at eval, so "
        "one request's output depends on the others in its batch (and a batch of one divides by a zero variance); train it with "
        "track_running_stats=True.",
    )


def never_trained(facts: LayerFacts) -> Hazard | None:
    """Running statistics still at their initial values (mean 0, var 1), or a BatchNorm's num_batches_tracked == 0.

    PyTorch's InstanceNorm never increments num_batches_tracked (torch/nn/modules/instancenorm.py),
    so only the values count there.
    """
    if not facts.tracked:
        return None
    tensors = facts.spec.tensors
    count = tensors.get("num_batches_tracked") if facts.kind == "batch" else None
    initial = bool(np.all(tensors["running_mean"] == 0) and np.all(tensors["running_var"] == 1))
    if count is not None and int(count) == 0:
        why = "num_batches_tracked is 0" + (" and the statistics are still mean 0, var 1" if initial else "")
    elif initial:
        why = "the running statistics are still at their initial values (mean 0, var 1)"
    else:
        return None
    return _hazard(
        "never_trained",
        "warning",
        f"{why}: the layer never saw data, so at eval it normalises nothing but scale and shift; train or recalibrate it "
        "(normbridge recalibrate) before serving.",
    )


def unconverged_statistics(facts: LayerFacts) -> Hazard | None:
    """A BatchNorm whose running statistics may still hold a large share of their initial values (mean 0, var 1).

    They start at mean 0 / var 1 and move by `momentum` per training batch, so after num_batches_tracked = t batches a
    share w = (1 - momentum) ** t of the initial values is left (monitoring/convergence.py): running_var = w + (1 - w)
    * sigma^2 >= w, running_mean = (1 - w) * mu. Flagged when w >= INITIAL_WEIGHT_FLOOR (5%: fewer than 29 batches at
    momentum 0.1) and every variance is at least w (a smaller one cannot be such a blend). Judged only where the layer
    keeps its batch counter and a momentum (torch modules and programs); Keras and ONNX keep no counter. The counter is
    history, not a measurement: statistics set another way (recalibrated, torch.optim.swa_utils.update_bn, copied) keep
    a counter that says nothing about them, so this is a warning that does not block serving, and `normbridge drift`
    tells the two apart on real inputs. num_batches_tracked == 0 is never_trained; momentum=None, a cumulative average,
    forgets the initial values at the first batch.
    """
    if facts.kind != "batch" or not facts.tracked or facts.spec.frozen:
        return None
    tensors = facts.spec.tensors
    count = tensors.get("num_batches_tracked")
    if count is None or int(count) <= 0 or is_initial(tensors["running_mean"], tensors["running_var"]):
        return None
    momentum = facts.spec.momentum_as("batch_weight")
    weight = initial_weight(int(count), momentum)
    if weight is None or weight < INITIAL_WEIGHT_FLOOR:
        return None
    if not np.all(np.asarray(tensors["running_var"], dtype=np.float64) >= weight * (1.0 - 1e-4)):
        return None
    needed = math.ceil(math.log(INITIAL_WEIGHT_FLOOR) / math.log(1.0 - momentum))
    return _hazard(
        "unconverged_statistics",
        "warning",
        f"num_batches_tracked={int(count)} at momentum {momentum:g}: if these are the running statistics kept since training began, "
        f"{weight:.0%} of them is still the initial values (mean 0, var 1), pulling running_var toward 1 and running_mean toward 0, so "
        f"at eval the layer normalises with statistics that match no input; train until num_batches_tracked reaches {needed} or "
        "recalibrate it (normbridge recalibrate). Statistics set another way (recalibrated, update_bn, copied) keep a counter that says "
        "nothing about them: `normbridge drift` on real inputs tells the two apart.",
    )


def momentum_none(facts: LayerFacts) -> Hazard | None:
    """PyTorch momentum=None: a cumulative average over every batch seen (not for frozen statistics, which no step
    moves)."""
    if not facts.tracked or facts.spec.momentum is not None or facts.spec.frozen:
        return None
    count = facts.spec.tensors.get("num_batches_tracked")
    seen = "" if count is None else f" (num_batches_tracked={int(count)})"
    ambiguous = (
        " (an eval export writes momentum=0.0 for it, so a momentum of exactly 0.0 reads the same)"
        if facts.origin == "exported_program"
        else ""
    )
    return _hazard(
        "momentum_none",
        "warning",
        f"momentum=None{ambiguous}: the running statistics are a cumulative average of every batch seen{seen}, so further training "
        "moves them less and less, and Keras and ONNX cannot express it; set a momentum (e.g. 0.1) if the layer is trained further.",
    )


def default_eps(facts: LayerFacts) -> tuple[float | None, str]:
    """The default eps of the framework the layer came from, and how to name it (None: PyTorch eps=None,
    schemas.floats.dtype_default_eps)."""
    framework = EXPORTER_FRAMEWORKS.get(facts.origin, facts.framework)
    info = KIND_INFO[facts.kind]
    # how a hazard names the framework's default (KindInfo.default_eps holds the values): its FrameworkInfo's words
    named = (
        REGISTRY.info(framework).default_eps_name
        if framework in REGISTRY.framework_names
        else f"the {framework} default"
    )
    default = info.default_eps[framework]
    if (
        default is None
    ):  # PyTorch's RMSNorm: eps=None means the eps of the dtype torch computes in, which the spec records as eps_origin="dtype_eps"
        named_class = (info.stock_classes(framework) or (facts.layer_type,))[0]
        return None, f"{named} for {named_class} (eps=None: the eps of the dtype torch computes in)"
    return default, f"{named} {default!r}"


def eps_not_default(facts: LayerFacts) -> Hazard | None:
    """eps differs from the source framework's default for the layer: intended, or replaced by a converter."""
    if facts.spec is not None:
        eps, dtype_eps = facts.spec.eps, facts.spec.eps_origin == "dtype_eps"
    elif facts.eps is not None:
        eps, dtype_eps = facts.eps, False
    else:
        return None
    adapter = REGISTRY.model_adapter(facts.framework)
    if adapter.own_eps_default(facts):
        return None
    default, named = default_eps(facts)
    if default is None:
        if dtype_eps:
            return None
    elif adapter.eps_stored_as_float32:
        if as_float32(eps) == as_float32(default):
            return None
    elif eps == default:
        return None
    return _hazard(
        "eps_not_default",
        "info",
        f"eps is {eps!r}, not {named}: fine when the model was built that way, but an eps replaced by a converter shows up here.",
    )


def eps_underflow(facts: LayerFacts) -> Hazard | None:
    """An eps that rounds to zero or to a subnormal in the dtype the statistics are computed in (float16(1e-8) == 0).

    Then var + eps no longer guards the division: a constant input divides by sqrt(0) or by a number with few bits.
    """
    spec = facts.spec
    if spec is None:
        return None
    dtype = spec.compute_dtype or spec.dtype
    info = ml_dtypes.finfo(dtype)
    stored = float(np.asarray(spec.eps, dtype=np.float64).astype(dtype))
    if stored != 0.0 and stored >= float(info.smallest_normal):
        return None
    became = "0" if stored == 0.0 else f"the subnormal {stored!r}"
    return _hazard(
        "eps_underflow",
        "warning" if stored == 0.0 else "info",
        f"eps={spec.eps!r} rounds to {became} in {dtype}, the dtype its statistics are computed in (smallest normal {float(info.smallest_normal):.3g}); "
        f"a constant input then divides by sqrt(0): raise eps to at least {float(info.smallest_normal):.3g} or compute the statistics in float32.",
    )


def op_summary(op_types: tuple[str, ...]) -> str:
    """'ReduceMean x2, Sub, Sqrt' from the ops of a decomposition, in first-seen order."""
    counts: dict[str, int] = {}
    for op in op_types:
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(op if n == 1 else f"{op} x{n}" for op, n in counts.items())


def _decomposition_fix(facts: LayerFacts) -> str:
    if facts.origin == "exported_program":
        return "save the program before run_decompositions()"
    if facts.origin == "tf2onnx":
        return "tf2onnx always decomposes it; normbridge export rewrites it into the native op"
    if KIND_INFO[facts.kind].onnx_op is None:
        return f"ONNX has no native {facts.kind} op: the decomposition is how ONNX holds it"
    return f"export with opset >= {KIND_INFO[facts.kind].onnx_opset}, which has the native op"


def decomposed(facts: LayerFacts) -> Hazard | None:
    """A normalization decomposed into primitive ops: reported as the layer it is,
    with its eps and the exporter's style."""
    if facts.native or facts.folded:
        return None
    eps = facts.spec.eps if facts.spec is not None else facts.eps
    exporter = EXPORTERS.get(facts.origin, facts.origin)
    ops = f" ({op_summary(facts.op_types)})" if facts.op_types else ""
    if eps is None:
        return _hazard(
            "decomposed",
            "warning",
            f"a {facts.kind} normalization decomposed into primitive ops{ops} by {exporter}; its eps could not be read, "
            f"so it cannot be checked; {_decomposition_fix(facts)}.",
        )
    return _hazard(
        "decomposed",
        "info",
        f"a {facts.kind} normalization with eps={eps!r} decomposed into primitive ops{ops} by {exporter}; it computes "
        f"the same function but runs slower and keeps eps in a constant; {_decomposition_fix(facts)}.",
    )


def folded_site(facts: LayerFacts) -> Hazard | None:
    """A BatchNorm folded into Mul/Add constants (tf2onnx): eps and statistics are baked in."""
    if not facts.folded:
        return None
    ops = op_summary(facts.op_types) or "Mul, Add"
    return _hazard(
        "folded_batchnorm",
        "warning",
        f"a BatchNorm was folded into constants ({ops}) by the exporter: its eps, running statistics, scale and bias are baked into "
        "one multiplier and one offset and can no longer be checked or recalibrated; keep the source model to recalibrate.",
    )


#: Every layer hazard, in the order they are reported.
LAYER_HAZARDS: tuple[Callable[[LayerFacts], Hazard | None], ...] = (
    unreadable,
    train_mode,
    batch_stats_at_eval,
    never_trained,
    unconverged_statistics,
    momentum_none,
    eps_not_default,
    eps_underflow,
    decomposed,
    folded_site,
)


def layer_hazards(facts: LayerFacts) -> list[Hazard]:
    """Every hazard of one layer."""
    return [hazard for check in LAYER_HAZARDS if (hazard := check(facts)) is not None]


def convergence_unjudged(facts: list[LayerFacts]) -> Hazard | None:
    """Tracked BatchNorms whose format keeps no batch counter (Keras, ONNX): whether their statistics converged
    (unconverged_statistics) cannot be judged from the file, and inspection says so rather than pass over it."""
    unjudged = [
        f.path
        for f in facts
        if f.kind == "batch" and f.tracked and not f.spec.frozen and "num_batches_tracked" not in f.spec.tensors
    ]
    if not unjudged:
        return None
    more = f" and {len(unjudged) - 3} more" if len(unjudged) > 3 else ""
    return _hazard(
        "convergence_unjudged",
        "info",
        f"{len(unjudged)} BatchNorm layer(s) ({', '.join(unjudged[:3])}{more}) keep no batch counter in this format, so whether their running "
        "statistics converged (unconverged_statistics) is not judged from the file; `normbridge drift` judges it on real inputs.",
    )
