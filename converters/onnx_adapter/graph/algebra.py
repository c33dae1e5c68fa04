"""A small symbolic algebra that reads what a subgraph computes from one input tensor X.

Exporters write the same normalization in many arrangements: torch.onnx as
`x * rsqrt(mean(x^2) + eps) * w`, tf2onnx as `x * (rsqrt(var + eps) * g) + (b - mean * rsqrt(var + eps) * g)`
with its transpose optimiser moving some operands to channels-last and others not, normbridge as
`(x - mean) / sqrt(var + eps) * scale + bias`. Rather than one template per arrangement, each
tensor is read as a polynomial in X and its statistics:

- `M`: mean of X over the axes A (ReduceMean or GlobalAveragePool with keepdims),
- `V`: mean of (X - M)^2 over the same A (the biased variance), or mean(X^2) - M^2 (ONNX's function bodies),
- `Q`: mean of X^2 over A (the RMS statistic),
- `SD`: sqrt(V + eps) or sqrt(Q + eps), the only place eps may enter,

with constant coefficients. Only these statistics are recognised, each only in its exact form
(coefficients exactly 1 and -2), so a subgraph reads as a normalization only if it computes one.
Every symbol carries an axis map: which axis of X each position of the tensor holds (None for a
broadcast position of size 1), so Transposes and layout-only Reshapes are followed exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .index import DimValue

Label = int | None
#: ("X",) | ("M", A) | ("V", A) | ("Q", A) | ("SD", "V" or "Q", A, eps, eps dtype)
Symbol = tuple
Monomial = tuple  # sorted ((symbol, exponent), ...)

X: Symbol = ("X",)
MAX_TERMS = 12


class NotNormalization(Exception):
    """The subgraph does not compute what the algebra can read (never a user-facing error)."""


def _key(powers: dict) -> Monomial:
    return tuple(sorted(((s, e) for s, e in powers.items() if e != 0), key=repr))


@dataclass
class Value:
    """A tensor as sum(coefficient * product(symbol ** exponent)); coefficients have the tensor's rank."""

    rank: int
    terms: dict[Monomial, np.ndarray]
    amaps: dict[Symbol, tuple[Label, ...]] = field(default_factory=dict)

    @staticmethod
    def input(rank: int) -> Value:
        return Value(rank, {_key({X: 1}): np.ones((1,) * rank, np.float32)}, {X: tuple(range(rank))})

    @staticmethod
    def constant(array: np.ndarray) -> Value:
        array = np.asarray(array)
        return Value(array.ndim, {(): array.reshape(array.shape or ())})

    def x_map(self) -> tuple[Label, ...] | None:
        return self.amaps.get(X)


def _pad(array: np.ndarray, rank: int) -> np.ndarray:
    return array.reshape((1,) * (rank - array.ndim) + array.shape)


def _pad_map(amap: tuple[Label, ...], rank: int) -> tuple[Label, ...]:
    return (None,) * (rank - len(amap)) + tuple(amap)


def _merge_maps(a: dict, b: dict, rank: int) -> dict:
    merged = {s: _pad_map(m, rank) for s, m in a.items()}
    for symbol, amap in b.items():
        amap = _pad_map(amap, rank)
        if symbol not in merged:
            merged[symbol] = amap
            continue
        combined = []
        for left, right in zip(merged[symbol], amap):
            if left is not None and right is not None and left != right:
                raise NotNormalization(f"{symbol[0]} is aligned differently in two operands")
            combined.append(left if left is not None else right)
        merged[symbol] = tuple(combined)
    return merged


def _broadcastable(a: np.ndarray, b: np.ndarray) -> None:
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise NotNormalization("operands do not broadcast") from None


def add(a: Value, b: Value) -> Value:
    rank = max(a.rank, b.rank)
    terms = {k: _pad(v, rank) for k, v in a.terms.items()}
    for key, coefficient in b.terms.items():
        coefficient = _pad(coefficient, rank)
        if key in terms:
            _broadcastable(terms[key], coefficient)
            terms[key] = terms[key] + coefficient
        else:
            terms[key] = coefficient
    if len(terms) > MAX_TERMS:
        raise NotNormalization("too many terms")
    return Value(rank, terms, _merge_maps(a.amaps, b.amaps, rank))


def neg(a: Value) -> Value:
    return Value(a.rank, {k: -v for k, v in a.terms.items()}, dict(a.amaps))


def sub(a: Value, b: Value) -> Value:
    return add(a, neg(b))


def mul(a: Value, b: Value) -> Value:
    rank = max(a.rank, b.rank)
    terms: dict[Monomial, np.ndarray] = {}
    for key_a, coef_a in a.terms.items():
        for key_b, coef_b in b.terms.items():
            powers = dict(key_a)
            for symbol, exponent in key_b:
                powers[symbol] = powers.get(symbol, 0) + exponent
            if any(abs(e) > 2 for e in powers.values()):
                raise NotNormalization("exponent out of range")
            key = _key(powers)
            left, right = _pad(coef_a, rank), _pad(coef_b, rank)
            _broadcastable(left, right)
            product = left * right
            terms[key] = terms[key] + product if key in terms else product
    if len(terms) > MAX_TERMS:
        raise NotNormalization("too many terms")
    return Value(rank, terms, _merge_maps(a.amaps, b.amaps, rank))


def _unit_monomial(value: Value) -> Monomial:
    """The monomial of a single-term value whose coefficient is exactly 1 (for Div and Reciprocal)."""
    if len(value.terms) != 1:
        raise NotNormalization("divisor is not a single statistic")
    ((key, coefficient),) = value.terms.items()
    if not key or coefficient.size != 1 or float(coefficient.reshape(())) != 1.0 or any(s == X for s, _ in key):
        raise NotNormalization("divisor is not a statistic")
    return key


def reciprocal(a: Value) -> Value:
    key = _unit_monomial(a)
    inverse = _key({s: -e for s, e in key})
    return Value(a.rank, {inverse: np.ones((1,) * a.rank, np.float32)}, dict(a.amaps))


def div(a: Value, b: Value) -> Value:
    return mul(a, reciprocal(b))


def _moments_variance(a: Value) -> Value:
    """Q - M^2 + eps over the same axes (E[x^2] - E[x]^2: ONNX's LayerNormalization and GroupNormalization function
    bodies) read as V + eps, the biased variance it equals; `a` itself otherwise."""
    stats = [k for k in a.terms if k]
    if len(stats) != 2 or () not in a.terms or any(len(k) != 1 for k in stats):
        return a
    by_kind = {(k[0][0][0], k[0][1]): k for k in stats}
    q, m = by_kind.get(("Q", 1)), by_kind.get(("M", 2))
    if q is None or m is None or q[0][0][1] != m[0][0][1]:
        return a
    if not (_is_unit(a.terms[q], 1.0) and _is_unit(a.terms[m], -1.0)) or a.amaps.get(q[0][0]) != a.amaps.get(m[0][0]):
        return a
    variance = ("V", q[0][0][1])
    return Value(a.rank, {_key({variance: 1}): a.terms[q], (): a.terms[()]}, {variance: a.amaps[q[0][0]]})


def sqrt(a: Value) -> Value:
    """sqrt(V + eps) or sqrt(Q + eps) with eps a one-element positive constant (V also as Q - M^2); nothing else."""
    a = _moments_variance(a)
    stats = [k for k in a.terms if k]
    if len(a.terms) != 2 or len(stats) != 1 or () not in a.terms:
        raise NotNormalization("sqrt of something other than statistic + eps")
    key = stats[0]
    if len(key) != 1 or key[0][1] != 1 or key[0][0][0] not in ("V", "Q"):
        raise NotNormalization("sqrt of something other than a variance")
    coefficient, eps = a.terms[key], a.terms[()]
    if coefficient.size != 1 or float(coefficient.reshape(())) != 1.0 or eps.size != 1:
        raise NotNormalization("variance is scaled, or eps is not one number")
    stat = key[0][0]
    eps_value = eps.reshape(())
    if not float(eps_value) > 0:
        raise NotNormalization("eps is not positive")
    symbol = ("SD", stat[0], stat[1], float(eps_value), str(eps_value.dtype))
    return Value(a.rank, {_key({symbol: 1}): np.ones((1,) * a.rank, np.float32)}, {symbol: a.amaps[stat]})


def _is_unit(coefficient: np.ndarray, value: float) -> bool:
    return coefficient.size == 1 and float(coefficient.reshape(())) == value


def reduce_mean(a: Value, positions: list[int]) -> Value:
    """M, Q or V from the mean over `positions` of X, X^2 or (X - M)^2 (same positions)."""
    x_map = a.x_map()
    if x_map is None or any(x_map[p] is None for p in positions) or not positions:
        raise NotNormalization("reduction of a value without X on the reduced axes")
    axes = frozenset(x_map[p] for p in positions)
    if 0 in axes and axes != frozenset(label for label in x_map if label is not None):
        # Statistics over every axis (ONNX's axis=0) normalise the whole tensor, which the spec holds; over the batch
        # axis and only some others they mix samples in a way no normalization kind does.
        raise NotNormalization("statistics over the batch axis")
    result_map = tuple(None if p in positions else label for p, label in enumerate(x_map))
    keys = set(a.terms)
    x1, x2 = _key({X: 1}), _key({X: 2})
    if keys == {x1} and _is_unit(a.terms[x1], 1.0):
        symbol: Symbol = ("M", axes)
    elif keys == {x2} and _is_unit(a.terms[x2], 1.0):
        symbol = ("Q", axes)
    else:
        mean = ("M", axes)
        centred = {x2: 1.0, _key({X: 1, mean: 1}): -2.0, _key({mean: 2}): 1.0}
        if keys != set(centred) or not all(_is_unit(a.terms[k], v) for k, v in centred.items()):
            raise NotNormalization("reduction of something other than x, x^2 or (x - mean)^2")
        if a.amaps.get(mean) != result_map:
            raise NotNormalization("variance centred with a mean over other axes")
        symbol = ("V", axes)
    return Value(a.rank, {_key({symbol: 1}): np.ones((1,) * a.rank, np.float32)}, {symbol: result_map})


def transpose(a: Value, perm: list[int]) -> Value:
    if sorted(perm) != list(range(a.rank)):
        raise NotNormalization("bad permutation")
    terms = {k: np.transpose(_pad(v, a.rank), perm) for k, v in a.terms.items()}
    amaps = {s: tuple(m[p] for p in perm) for s, m in a.amaps.items()}
    return Value(a.rank, terms, amaps)


def value_dims(a: Value, x_dims: tuple[DimValue, ...]) -> list[DimValue]:
    """The tensor's dims: X's dim where a symbol places an axis, else the coefficients' extent."""
    dims: list[DimValue] = []
    for position in range(a.rank):
        labels = {m[position] for m in a.amaps.values() if m[position] is not None}
        if len(labels) > 1:
            raise NotNormalization("two axes at one position")
        if labels:
            dims.append(x_dims[labels.pop()])
        else:
            dims.append(max(_pad(c, a.rank).shape[position] for c in a.terms.values()))
    return dims


def reshape(a: Value, target: list[DimValue], x_dims: tuple[DimValue, ...]) -> Value:
    """A Reshape that only inserts, drops or moves size-1 dims (a layout change of a reduced tensor)."""
    current = value_dims(a, x_dims)
    moving = [p for p, d in enumerate(current) if d != 1]
    placed = [p for p, d in enumerate(target) if d != 1]
    if len(moving) != len(placed):
        raise NotNormalization("reshape changes more than size-1 dims")
    for source, destination in zip(moving, placed):
        wanted = target[destination]
        if wanted != -1 and wanted != current[source]:
            raise NotNormalization("reshape changes a dim")
    if target.count(-1) and not any(target[p] == -1 for p in placed):
        raise NotNormalization("unresolved -1")
    rank = len(target)
    mapping = dict(zip(moving, placed))
    amaps = {}
    for symbol, amap in a.amaps.items():
        moved = [None] * rank
        for source, destination in mapping.items():
            moved[destination] = amap[source]
        amaps[symbol] = tuple(moved)
    terms = {}
    for key, coefficient in a.terms.items():
        coefficient = _pad(coefficient, a.rank)
        shape = [1] * rank
        for source, destination in mapping.items():
            shape[destination] = coefficient.shape[source]
        if any(coefficient.shape[p] != 1 for p in range(a.rank) if p not in mapping):
            raise NotNormalization("coefficient on a dropped axis")
        terms[key] = coefficient.reshape(shape)
    return Value(rank, terms, amaps)
