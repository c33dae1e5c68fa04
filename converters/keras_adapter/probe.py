"""A behavioural probe for custom Keras normalization layers (keras_hub's RMS and layer norms, a user's own).

A Keras custom layer has no graph to match, so it is recognised by what it computes: the layer is
called on fixed inputs, each hypothesis (layer or rms over the variables' trailing axes; which
variable is the scale and which the bias; an affine factor `w` or `1 + w`, Gemma's) gets its eps
recovered from an input whose variance is of the order of eps, and a hypothesis is accepted only
when the layer's outputs equal the NumPy reference (converters/reference/) on every probe input.
Nothing is guessed from a class name: a layer that no hypothesis proves is not recognised.
"""

from __future__ import annotations

import itertools
import math
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas import NormSpec

from .. import reference
from .keras_internals import has_sublayers
from .runtime import import_keras

#: Short variable names read as a scale, and as a bias; any other name may be either.
SCALE_NAMES = frozenset({"scale", "gamma", "weight", "g", "w"})
BIAS_NAMES = frozenset({"beta", "bias", "offset", "shift", "b"})
#: Attributes a layer may keep its eps in; a recovered eps close to one of them is replaced by it.
EPS_ATTRIBUTES = ("epsilon", "eps", "variance_epsilon", "variance_eps")
#: The affine factors tried: scale_offset + w (Gemma stores w as an offset from 1).
OFFSETS = (0.0, 1.0)
#: Probe-to-reference tolerance: float32 arithmetic, float64 reference.
RTOL, ATOL = 2e-4, 2e-5
#: Sizes given to the open axes of the built input shape (batch first).
OPEN_BATCH, OPEN_DIM = 3, 4


@dataclass(frozen=True)
class ProbedNorm:
    """What the probe proved a layer computes; variables are named by their short name on the layer."""

    kind: str
    eps: float
    normalized_shape: tuple[int, ...]
    input_rank: int
    scale: str | None
    bias: str | None
    scale_offset: float


@dataclass(frozen=True)
class ProbeResult:
    """The proof, or why there is none (one sentence)."""

    norm: ProbedNorm | None
    reason: str = ""


_CACHE: "weakref.WeakKeyDictionary[Any, ProbeResult]" = weakref.WeakKeyDictionary()


def short_name(variable: Any) -> str:
    return variable.path.rsplit("/", 1)[-1]


def probe_layer(layer: Any) -> ProbeResult:
    """The probe's verdict on `layer`, computed once per layer object (the class decides, not the current weights)."""
    try:
        return _CACHE[layer]
    except (KeyError, TypeError):
        pass
    result = _probe(layer)
    try:
        _CACHE[layer] = result
    except TypeError:
        pass
    return result


def _probe(layer: Any) -> ProbeResult:
    if not layer.built:
        return ProbeResult(None, "it is not built, so it cannot be called on a probe; call it on an input first")
    if has_sublayers(layer):
        return ProbeResult(None, "it holds sublayers, which a normalization layer does not")
    if str(layer.compute_dtype) not in ("float32", "float64") or str(layer.variable_dtype) != str(layer.compute_dtype):
        return ProbeResult(
            None, f"its dtype policy '{layer.dtype_policy.name}' is not float32 or float64; the probe reads those only"
        )
    shape = _input_shape(layer)
    if shape is None:
        return ProbeResult(None, "it records no single input shape")
    variables = list(layer.weights)
    normalized = _normalized_shape(variables, shape)
    if normalized is None and (called := _called_shape(variables, shape)) is not None:
        shape, normalized = called, _normalized_shape(variables, called)
    if normalized is None:
        return ProbeResult(
            None,
            f"its variables {[f'{short_name(v)}{list(v.shape)}' for v in variables]} are not per-feature vectors of "
            f"the trailing axes of its input {list(shape)}",
        )
    before = [np.array(v.numpy(), copy=True) for v in variables]
    try:
        norm = next((n for h in _hypotheses(variables) if (n := _try(layer, shape, normalized, h)) is not None), None)
    except Exception as error:  # a layer that refuses the probe inputs is simply not proved
        return ProbeResult(
            None, f"calling it on a probe input raised {type(error).__name__}: {str(error).strip()[:200]}"
        )
    finally:
        changed = [(v, old) for v, old in zip(variables, before) if not np.array_equal(v.numpy(), old)]
        for variable, old in changed:
            variable.assign(old)
    if changed:
        return ProbeResult(None, "calling it changed its variables, which an inference-mode normalization does not")
    if norm is None:
        return ProbeResult(None, "no layer or RMS normalization over its trailing axes reproduces its outputs")
    return ProbeResult(norm)


def _input_shape(layer: Any) -> tuple[int, ...] | None:
    shape = (layer.get_build_config() or {}).get("input_shape")
    if not isinstance(shape, (tuple, list)) or not shape or not all(d is None or isinstance(d, int) for d in shape):
        return None
    return tuple(OPEN_BATCH if i == 0 and d is None else OPEN_DIM if d is None else int(d) for i, d in enumerate(shape))


def _called_shape(variables: list, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The recorded input shape with its trailing axes replaced by the variables' common shape, where they differ.

    keras_hub builds Qwen3's per-head query and key norms (Qwen3LayerNorm(head_dim)) with the hidden states' shape (B,
    T, hidden) and calls them on (B, T, heads, head_dim): their scale of head_dim can only meet an input whose trailing
    axis is head_dim, so that is the input probed (and the proof still decides)."""
    shapes = {tuple(int(d) for d in v.shape) for v in variables}
    if len(shapes) != 1:
        return None
    trailing = shapes.pop()
    if not trailing or len(trailing) >= len(shape) or tuple(shape[-len(trailing) :]) == trailing:
        return None
    return tuple(shape[: -len(trailing)]) + trailing


def _normalized_shape(variables: list, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The variables' common shape when it is the input's trailing shape; the last axis when there are none."""
    if len(variables) > 2:
        return None
    if not variables:
        return shape[-1:] if len(shape) >= 2 else None
    shapes = {tuple(int(d) for d in v.shape) for v in variables}
    if len(shapes) != 1:
        return None
    normalized = shapes.pop()
    if not normalized or len(normalized) >= len(shape) or tuple(shape[-len(normalized) :]) != normalized:
        return None
    return normalized


def _hypotheses(variables: list):
    """(kind, scale variable, bias variable, offset) in the order tried."""
    names = [short_name(v) for v in variables]
    roles: list[tuple[str | None, str | None]] = []
    if not names:
        roles = [(None, None)]
    elif len(names) == 1:
        roles = [(None, names[0])] if names[0] in BIAS_NAMES else [(names[0], None)]
    else:
        for scale, bias in itertools.permutations(names):
            if scale not in BIAS_NAMES and bias not in SCALE_NAMES:
                roles.append((scale, bias))
    for kind in ("rms", "layer"):
        for scale, bias in roles:
            if kind == "rms" and bias is not None:
                continue
            for offset in OFFSETS if scale is not None else (0.0,):
                yield kind, scale, bias, offset


def _call(layer: Any, x: np.ndarray) -> np.ndarray:
    keras = import_keras()
    return np.asarray(keras.ops.convert_to_numpy(layer(x.astype(layer.compute_dtype))), dtype=np.float64)


def _try(layer: Any, shape: tuple[int, ...], normalized: tuple[int, ...], hypothesis) -> ProbedNorm | None:
    kind, scale, bias, offset = hypothesis
    tensors = {short_name(v): np.asarray(v.numpy(), dtype=np.float64) for v in layer.weights}
    factor = offset + tensors[scale] if scale is not None else np.ones(normalized)
    shift = tensors[bias] if bias is not None else np.zeros(normalized)
    eps = _recover_eps(layer, shape, normalized, kind, factor, shift)
    if eps is None:
        return None
    norm = ProbedNorm(kind, eps, normalized, len(shape), scale, bias, offset)
    return norm if prove(layer, norm, shape) else None


def _moments(x: np.ndarray, count: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    axes = tuple(range(x.ndim - count, x.ndim))
    if kind == "rms":
        return np.zeros((1,) * x.ndim), np.mean(x * x, axis=axes, keepdims=True)
    return x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)


def _recover_eps(layer, shape, normalized, kind, factor, shift) -> float | None:
    """eps from inputs of shrinking variance, read where the variance no longer hides it; None if none fits."""
    count = len(normalized)
    usable = np.abs(factor) > 1e-3 * max(float(np.max(np.abs(factor))), 1e-30)
    if not usable.any():
        return None
    base = np.random.default_rng(7).standard_normal(shape)
    for exponent in range(0, 13):
        x = base * 10.0 ** (-exponent)
        mean, var = _moments(x, count, kind)
        u = (_call(layer, x) - shift) / np.where(usable, factor, 1.0)
        centred = x - mean
        good = usable & (np.abs(u) > 0.1 * np.max(np.abs(u), initial=0.0)) & (np.abs(centred) > 0)
        if not good.any():
            return None
        estimate = float(np.median(np.square(centred[good] / u[good])) - np.median(np.broadcast_to(var, x.shape)[good]))
        if not math.isfinite(estimate):
            return None
        if estimate > float(np.median(var)):  # eps dominates the variance here: read to float32 precision
            return _exact_eps(layer, estimate) if estimate > 0 else None
    return None


def _exact_eps(layer: Any, estimate: float) -> float:
    """The layer's own eps attribute when it agrees with the estimate, else the shortest decimal within the estimate's
    precision."""
    for attribute in EPS_ATTRIBUTES:
        value = getattr(layer, attribute, None)
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value > 0
            and abs(value - estimate) <= 1e-3 * value
        ):
            return float(value)
    for digits in range(1, 8):
        rounded = float(f"{estimate:.{digits - 1}e}")
        if abs(rounded - estimate) <= 1e-4 * estimate:
            return rounded
    return float(f"{estimate:.7e}")


def effective_spec(layer: Any, norm: ProbedNorm) -> NormSpec:
    """The spec the reference computes the proof with: the affine factor scale_offset + w as a plain scale."""
    tensors = {short_name(v): np.asarray(v.numpy(), dtype=np.float64) for v in layer.weights}
    arrays = {}
    if norm.scale is not None:
        arrays["scale"] = norm.scale_offset + tensors[norm.scale]
    if norm.bias is not None:
        arrays["bias"] = tensors[norm.bias]
    return NormSpec(
        name="probe",
        kind=norm.kind,
        eps=norm.eps,
        normalized_shape=norm.normalized_shape,
        input_rank=norm.input_rank,
        scale=norm.scale is not None,
        bias=norm.bias is not None,
        dtype="float64",
        tensors=arrays,
    )


def prove(layer: Any, norm: ProbedNorm, shape: tuple[int, ...]) -> bool:
    """Whether the layer equals the reference on every probe input: ordinary, shifted, and of the order of eps."""
    spec = effective_spec(layer, norm)
    rng = np.random.default_rng(11)
    base = rng.standard_normal(shape)
    rows = np.linspace(0.5, 2.0, shape[0]).reshape((-1,) + (1,) * (len(shape) - 1))  # every row its own statistics
    probes = [base * 1.5 + 0.25, base * rows + 3.0 * rows, base * math.sqrt(norm.eps), rng.uniform(-4, 4, shape)]
    for x in probes:
        expected = reference.forward(spec, x, False)
        got = _call(layer, x)
        if got.shape != expected.shape or not np.allclose(
            got, expected, rtol=RTOL, atol=ATOL * max(1.0, float(np.max(np.abs(expected))))
        ):
            return False
    return True
