"""Statistics decompositions: LayerNorm, RMSNorm, GroupNorm and InstanceNorm written as moments.

From each tensor X that a ReduceMean or GlobalAveragePool reads (or reads squared), every
tensor computable from X and constants is read with `onnx_patterns_algebra`; a tensor that
computes (X - mean) / sqrt(var + eps) * g + b or X / sqrt(mean(X^2) + eps) * g completes a site.
Its kind follows from where the statistics and the affine vary: over the same axes (layer, rms),
statistics over all but one channel axis with a per-channel affine (instance), or, after a
Reshape that splits the channels into (groups, channels per group) and a Reshape back, group
(instance when each group is one channel: Keras's GroupNormalization(groups=-1)).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import onnx

from . import onnx_patterns_algebra as algebra
from .onnx_patterns_algebra import NotNormalization, Value, X
from .onnx_patterns_graph import (
    FLOAT_TYPES,
    GraphIndex,
    attribute,
    resolve_reshape,
    same_shape,
    shape_chain,
)
from .onnx_patterns_match import Match, origin_of, recover_eps, site_name

#: Regions larger than this are not normalizations; the bound keeps a pathological graph cheap.
MAX_REGION = 400


def _positions(node: onnx.NodeProto, index: GraphIndex, rank: int) -> list[int]:
    axes = attribute(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        array = index.constant(node.input[1])
        if array is None:
            raise NotNormalization("axes are computed")
        axes = [int(a) for a in np.atleast_1d(array)]
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
        if array is not None and array.dtype.kind == "f":
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
            if attribute(node, "keepdims", 1) != 1:
                raise NotNormalization("keepdims=0")
            positions = _positions(node, index, base.rank)
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
        data = [name for name in node.input if name and name not in index.constants]
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


def _slice(index: GraphIndex, region: dict[str, tuple[Value, int]], output: str, root: str) -> list[int]:
    """Nodes of the region that `output` depends on."""
    nodes, stack = set(), [output]
    while stack:
        name = stack.pop()
        if name == root or name not in region:
            continue
        i = region[name][1]
        if i in nodes:
            continue
        nodes.add(i)
        stack.extend(n for n in index.nodes[i].input if n)
    return sorted(nodes)


def _extends(index: GraphIndex, node: onnx.NodeProto, current: Form, following: Form) -> bool:
    """Whether the next node still belongs to the layer: a cast, or the affine the layer lacked."""
    if following.signature != current.signature:
        return False
    if node.op_type in ("Cast", "Identity"):
        return True
    constants = [index.constant(name) for name in node.input if name in index.constants]
    per_element = len(constants) == 1 and constants[0].size > 1
    if node.op_type == "Mul":
        return per_element and current.scale is None and current.bias is None
    if node.op_type in ("Add", "Sub"):  # bias - y would negate the layer
        return per_element and current.bias is None and (node.op_type == "Add" or node.input[0] not in index.constants)
    return False


def _varies_only(array: np.ndarray | None, rank: int, positions: set[int]) -> bool:
    if array is None:
        return True
    padded = array.reshape((1,) * (rank - array.ndim) + array.shape)
    return all(padded.shape[p] == 1 for p in range(rank) if p not in positions)


def _squeeze_to(array: np.ndarray | None, rank: int, keep: list[int], dims: tuple) -> np.ndarray | None:
    """The coefficient over positions `keep` (others are size 1), broadcast to `dims`."""
    if array is None:
        return None
    padded = array.reshape((1,) * (rank - array.ndim) + array.shape)
    kept = padded.reshape([padded.shape[p] for p in keep])
    return np.ascontiguousarray(np.broadcast_to(kept, dims))


def _known(dims) -> bool:
    return all(isinstance(d, int) and d > 0 for d in dims)


def _reshape_split(index: GraphIndex, x5: str):
    """(Reshape node index, xin, axis c, groups, channels) when x5 = Reshape(xin) splits axis c of xin into (G, C/G)."""
    i = index.producer.get(x5)
    if i is None or index.nodes[i].op_type != "Reshape":
        return None
    node = index.nodes[i]
    xin = node.input[0]
    source = index.dims(xin)
    target = index.int_values(node.input[1])
    if source is None or target is None or len(target) != len(source) + 1:
        return None
    target = resolve_reshape(target, source, attribute(node, "allowzero", 0))
    if target is None:
        return None
    for c in range(1, len(source)):
        channels, groups, per_group = source[c], target[c], target[c + 1]
        if not all(isinstance(d, int) for d in (channels, groups, per_group)) or groups < 1 or groups * per_group != channels:
            continue
        rest = list(source[:c]) + list(source[c + 1:])
        others = list(target[:c]) + list(target[c + 2:])
        if others.count(-1) <= 1 and all(d == r for d, r in zip(others, rest) if d != -1):
            return i, xin, c, groups, channels
    return None


def _centred(index: GraphIndex, tensor: str) -> bool:
    """`tensor` is x - mean(x) (Sub of a ReduceMean or GlobalAveragePool of its own first operand)."""
    node = index.producer_node(tensor)
    if node is None or node.op_type != "Sub" or len(node.input) != 2:
        return False
    mean = index.producer_node(node.input[1])
    return mean is not None and mean.op_type in ("ReduceMean", "GlobalAveragePool") and mean.input[0] == node.input[0]


def _classify(index: GraphIndex, root: str, output: str, form: Form, nodes: list[int]) -> Match | None:
    """Kind, axes and affine of a complete form; None when its coefficients fit no kind exactly."""
    x_dims = index.dims(root)
    rank = len(x_dims)
    frame, axes = form.frame, form.axes
    if form.which == "Q" and _centred(index, root):
        return None  # the RMS of x - mean(x): a LayerNorm whose statistics disagree, not an RMSNorm
    eps = recover_eps(form.eps, form.eps_dtype)
    dtype = index.dtype(root)
    common = dict(native=False, eps=eps, dtype=dtype, rank=rank, frame=frame)
    inverse = {label: p for p, label in enumerate(frame)}

    # GroupNorm written over a Reshape that splits the channels into (groups, channels per group).
    split = _reshape_split(index, root) if form.which == "V" else None
    if split is not None:
        r_in, xin, c, groups, channels = split
        r_out = index.single_consumer(output)
        if (
            r_out is not None and index.nodes[r_out].op_type == "Reshape" and frame == tuple(range(rank))
            and axes == frozenset(range(1, rank)) - {c} and same_shape(index, index.nodes[r_out].input[1], xin)
            and _varies_only(form.scale, rank, {c, c + 1}) and _varies_only(form.bias, rank, {c, c + 1})
        ):
            dims = (groups, channels // groups)
            scale, bias = (_squeeze_to(a, rank, [c, c + 1], dims) for a in (form.scale, form.bias))
            extra = [r_in, r_out] + shape_chain(index, index.nodes[r_out].input[1]) + shape_chain(index, index.nodes[r_in].input[1])
            common.update(rank=rank - 1, frame=tuple(range(rank - 1)))  # the site reads and writes xin's layout
            return Match(
                kind="instance" if groups == channels else "group", input=xin, output=index.nodes[r_out].output[0],
                nodes=sorted(set(nodes + extra)), origin="", name="", channel_axis=c, groups=groups, dims=(channels,),
                scale=None if scale is None else scale.reshape(channels), bias=None if bias is None else bias.reshape(channels), **common,
            )
        return None

    # LayerNorm / RMSNorm: the affine varies over the normalised axes only.
    norm_positions = [p for p in range(rank) if frame[p] in axes]
    if _varies_only(form.scale, rank, set(norm_positions)) and _varies_only(form.bias, rank, set(norm_positions)):
        dims = tuple(x_dims[frame[p]] for p in norm_positions)
        if not _known(dims):
            if form.scale is not None or form.bias is not None:
                return None
            dims = None
        scale = None if dims is None else _squeeze_to(form.scale, rank, norm_positions, dims)
        bias = None if dims is None else _squeeze_to(form.bias, rank, norm_positions, dims)
        return Match(
            kind="layer" if form.which == "V" else "rms", input=root, output=output, nodes=nodes, origin="", name="",
            axes=tuple(frame[p] for p in norm_positions), dims=dims, scale=scale, bias=bias, **common,
        )

    # InstanceNorm: statistics over every axis but batch and channel, per-channel affine.
    if form.which == "V":
        channel = [a for a in range(1, rank) if a not in axes]
        if len(channel) == 1 and axes == frozenset(range(1, rank)) - {channel[0]}:
            c = channel[0]
            position = inverse[c]
            if _varies_only(form.scale, rank, {position}) and _varies_only(form.bias, rank, {position}) and isinstance(x_dims[c], int):
                size = (x_dims[c],)
                return Match(
                    kind="instance", input=root, output=output, nodes=nodes, origin="", name="", channel_axis=c, dims=size,
                    scale=_squeeze_to(form.scale, rank, [position], size), bias=_squeeze_to(form.bias, rank, [position], size), **common,
                )
    return None


def _input_cast(index: GraphIndex, match: Match, claimed: set[int]) -> None:
    """Include a Cast that only widens the input for the statistics (normbridge's float16 graphs)."""
    i = index.producer.get(match.input)
    if i is None or i in claimed or index.nodes[i].op_type != "Cast":
        return
    source = index.nodes[i].input[0]
    users = set(index.consumer_nodes(match.input))
    if index.dtype(source) is None or not users <= set(match.nodes) or match.input in index.graph_outputs:
        return
    match.nodes = sorted(set(match.nodes) | {i})
    match.input, match.dtype = source, index.dtype(source)


def match_moments(index: GraphIndex, root: str, claimed: set[int]) -> list[Match]:
    """Statistics decompositions reading `root` (see the module docstring)."""
    region = interpret_region(index, root)
    forms: dict[str, tuple[Form, int]] = {}
    for name, (value, i) in region.items():
        form = read_form(value)
        if form is not None:
            forms[name] = (form, i)
    matches, used = [], set()
    for name, (form, i) in sorted(forms.items(), key=lambda item: item[1][1]):
        if i in used:
            continue
        output, current = name, form
        while True:
            nxt = index.single_consumer(output)
            if nxt is None or not index.nodes[nxt].output or index.nodes[nxt].output[0] not in forms:
                break
            following = forms[index.nodes[nxt].output[0]][0]
            if not _extends(index, index.nodes[nxt], current, following):
                break
            output, current = index.nodes[nxt].output[0], following
        nodes = _slice(index, region, output, root)
        used.update(nodes)
        if set(nodes) & claimed:
            continue
        match = _classify(index, root, output, current, nodes)
        if match is None or set(match.nodes) & claimed:
            continue
        _input_cast(index, match, claimed)
        match.origin = origin_of(index, match.nodes)
        match.name = site_name(index, match.nodes, match.output)
        claimed.update(match.nodes)
        matches.append(match)
    return matches


def statistic_root(index: GraphIndex, reduced: str) -> str:
    """The tensor a mean is taken of: x itself, or x for mean(x * x) and mean(x ** 2) (RMSNorm)."""
    node = index.producer_node(reduced)
    if node is not None and node.op_type == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
        return node.input[0]
    if node is not None and node.op_type == "Pow" and len(node.input) == 2:
        exponent = index.constant(node.input[1])
        if exponent is not None and exponent.size == 1 and float(exponent.reshape(())) == 2.0:
            return node.input[0]
    return reduced
