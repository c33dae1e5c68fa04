"""Reading what a region of an ONNX graph computes from one tensor X, and whether it is a whole normalization.

`interpret_region` reads every tensor computable from X and constants as an `algebra.Value`;
`read_form` says whether a Value is a complete (X - mean) / sqrt(var + eps) * g + b or
X / sqrt(mean(X^2) + eps) * g, and with which axes, eps and affine (`Form`). `moments` decides
the kind from there.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import onnx

from schemas.floats import is_float_dtype

from . import algebra
from .algebra import NotNormalization, Value, X
from .index import FLOAT_TYPES, GraphIndex, attribute, resolve_reshape

#: Regions larger than this are not normalizations; the bound keeps a pathological graph cheap.
MAX_REGION = 400


def _positions(node: onnx.NodeProto, index: GraphIndex, rank: int) -> list[int]:
    axes = attribute(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        values = index.int_values(node.input[1])  # a constant, or computed from X's rank (ONNX's RMSNormalization body)
        if values is None or not all(isinstance(a, int) for a in values):
            raise NotNormalization("axes are computed")
        axes = [int(a) for a in values]
    if not axes:
        raise NotNormalization("reduction over every axis")
    positions = sorted({a + rank if a < 0 else a for a in axes})
    if any(not 0 <= p < rank for p in positions):
        raise NotNormalization("axis out of range")
    return positions


def _interpret(index: GraphIndex, node: onnx.NodeProto, values: dict[str, Value], x_dims) -> Value:
    op = node.op_type

    def value(position: int) -> Value:
        name = node.input[position] if position < len(node.input) else ""
        if name in values:
            return values[name]
        array = index.constant(name)
        if array is not None and is_float_dtype(array.dtype):
            if array.dtype.name == "bfloat16":  # exact in float32; the coefficients are combined in floating point
                array = array.astype(np.float32)
            return Value.constant(array)
        raise NotNormalization(f"input {name!r} is neither derived from X nor a float constant")

    if op == "Identity":
        return value(0)
    if op == "Cast":
        if attribute(node, "to") not in FLOAT_TYPES:
            raise NotNormalization("cast to a non-float type")
        return value(0)
    if op == "Neg":
        return algebra.neg(value(0))
    if op == "Add":
        return algebra.add(value(0), value(1))
    if op == "Sub":
        return algebra.sub(value(0), value(1))
    if op == "Mul":
        return algebra.mul(value(0), value(1))
    if op == "Div":
        return algebra.div(value(0), value(1))
    if op == "Reciprocal":
        return algebra.reciprocal(value(0))
    if op == "Sqrt":
        return algebra.sqrt(value(0))
    if op == "Pow":
        exponent = index.constant(node.input[1])
        if exponent is None or exponent.size != 1:
            raise NotNormalization("computed exponent")
        e = float(exponent.reshape(()))
        base = value(0)
        if e == 2.0:
            return algebra.mul(base, base)
        if e == 0.5:
            return algebra.sqrt(base)
        if e == -0.5:
            return algebra.reciprocal(algebra.sqrt(base))
        raise NotNormalization("other power")
    if op in ("ReduceMean", "GlobalAveragePool"):
        base = value(0)
        if op == "ReduceMean":
            positions = _positions(node, index, base.rank)
            if (
                attribute(node, "keepdims", 1) != 1
            ):  # torch.onnx's x.var(): the reduced axes dropped, a Reshape puts them back
                reduced = algebra.reduce_mean(base, positions)
                dims = algebra.value_dims(reduced, x_dims)
                return algebra.reshape(reduced, [d for p, d in enumerate(dims) if p not in positions], x_dims)
        else:
            if base.rank < 3:
                raise NotNormalization("GlobalAveragePool needs rank >= 3")
            positions = list(range(2, base.rank))
        return algebra.reduce_mean(base, positions)
    if op == "Transpose":
        base = value(0)
        perm = attribute(node, "perm") or list(reversed(range(base.rank)))
        return algebra.transpose(base, [int(p) for p in perm])
    if op == "Reshape":
        base = value(0)
        target = index.int_values(node.input[1])
        if target is None:
            raise NotNormalization("reshape target unknown")
        current = algebra.value_dims(base, x_dims)
        target = resolve_reshape(target, tuple(current), attribute(node, "allowzero", 0))
        if target is None:
            raise NotNormalization("bad reshape target")
        return algebra.reshape(base, target, x_dims)
    raise NotNormalization(f"{op} is not part of a normalization")


def interpret_region(index: GraphIndex, root: str) -> dict[str, tuple[Value, int]]:
    """Every tensor computable from `root` and constants alone, read as a Value (with its node index)."""
    x_dims = index.dims(root)
    if x_dims is None or index.dtype(root) is None:
        return {}
    values: dict[str, Value] = {root: Value.input(len(x_dims))}
    found: dict[str, tuple[Value, int]] = {}
    heap = sorted(set(index.consumer_nodes(root)))
    heapq.heapify(heap)
    queued = set(heap)
    while heap and len(found) < MAX_REGION:
        i = heapq.heappop(heap)
        node = index.nodes[i]
        if not index.default_domain(i) or len(node.output) != 1:
            continue
        # Integer inputs computed from shapes (ONNX's RMSNormalization body computes its axes from X's rank) are not
        # data.
        data = [name for name in node.input if name and name not in index.constants and index.int_values(name) is None]
        if not data or any(name not in values for name in data):
            continue
        try:
            result = _interpret(index, node, values, x_dims)
        except NotNormalization:
            continue
        values[node.output[0]] = result
        found[node.output[0]] = (result, i)
        for consumer in index.consumer_nodes(node.output[0]):
            if consumer not in queued:
                queued.add(consumer)
                heapq.heappush(heap, consumer)
    return found


@dataclass
class Form:
    """A complete normalization read from a Value."""

    which: str  # "V" (centred) or "Q" (rms)
    axes: frozenset
    eps: float
    eps_dtype: str
    frame: tuple[int, ...]
    scale: np.ndarray | None
    bias: np.ndarray | None

    @property
    def signature(self):
        return (self.which, self.axes, self.eps, self.eps_dtype)


def _unit(array: np.ndarray) -> bool:
    return array.size == 1 and float(array.reshape(())) == 1.0


def read_form(v: Value) -> Form | None:
    """The normalization `v` computes, or None when it is not (yet) a complete one."""
    frame = v.x_map()
    if frame is None or any(label is None for label in frame) or sorted(frame) != list(range(v.rank)):
        return None
    x_terms = [k for k in v.terms if (X, 1) in k]
    if len(x_terms) != 1 or len(x_terms[0]) != 2:
        return None
    x_key = x_terms[0]
    sd, exponent = next((s, e) for s, e in x_key if s != X)
    if sd[0] != "SD" or exponent != -1:
        return None
    which, axes, eps, eps_dtype = sd[1], sd[2], sd[3], sd[4]
    scale = v.terms[x_key]
    bias = v.terms.get(())
    if which == "Q":
        if set(v.terms) != {x_key}:
            return None
        statistics = [sd]
    else:
        m_key = algebra._key({("M", axes): 1, sd: -1})
        if m_key not in v.terms or not set(v.terms) <= {x_key, m_key, ()}:
            return None
        shape = np.broadcast_shapes(scale.shape, v.terms[m_key].shape)
        if not np.array_equal(np.broadcast_to(v.terms[m_key], shape), -np.broadcast_to(scale, shape)):
            return None
        statistics = [sd, ("M", axes)]
    for symbol in statistics:
        expected = tuple(None if label in axes else label for label in frame)
        if v.amaps.get(symbol) != expected:
            return None
    return Form(which, axes, eps, eps_dtype, tuple(frame), None if _unit(scale) else scale, bias)
