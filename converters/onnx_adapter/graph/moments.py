"""Statistics decompositions: LayerNorm, RMSNorm, GroupNorm and InstanceNorm written as moments.

From each tensor X that a ReduceMean or GlobalAveragePool reads (or reads squared), every
tensor computable from X and constants is read (`forms`); a tensor that computes
(X - mean) / sqrt(var + eps) * g + b or X / sqrt(mean(X^2) + eps) * g completes a site.
Its kind follows from where the statistics and the affine vary: over the same axes (layer, rms),
statistics over all but one channel axis with a per-channel affine (instance), or, after a
Reshape that splits the channels into (groups, channels per group) and a Reshape back, group
(instance when each group is one channel: Keras's GroupNormalization(groups=-1)).
"""

from __future__ import annotations

import numpy as np
import onnx

from .algebra import Value
from .forms import Form, interpret_region, read_form
from .index import GraphIndex, same_shape, shape_chain
from .match import Match, origin_of, recover_eps, site_name
from .views import reshape_splits, runtime_affine, unflatten, ungroup


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
    splits = reshape_splits(index, root) if form.which == "V" else []
    widen = index.producer.get(root) if form.which == "V" and not splits else None
    if (
        widen is not None
        and index.nodes[widen].op_type == "Cast"
        and index.dtype(index.nodes[widen].input[0]) is not None
    ):
        splits = reshape_splits(
            index, index.nodes[widen].input[0]
        )  # a Keras mixed-policy GroupNormalization: Reshape, then Cast
    else:
        widen = None
    for r_in, xin, c, groups, channels in splits:
        r_out = index.single_consumer(output)
        if (
            r_out is not None
            and index.nodes[r_out].op_type == "Reshape"
            and frame == tuple(range(rank))
            and axes == frozenset(range(1, rank)) - {c}
            and same_shape(index, index.nodes[r_out].input[1], xin)
            and _varies_only(form.scale, rank, {c, c + 1})
            and _varies_only(form.bias, rank, {c, c + 1})
        ):
            dims = (groups, channels // groups)
            scale, bias = (_squeeze_to(a, rank, [c, c + 1], dims) for a in (form.scale, form.bias))
            extra = (
                [r_in, r_out]
                + shape_chain(index, index.nodes[r_out].input[1])
                + shape_chain(index, index.nodes[r_in].input[1])
            )
            extra += [widen] if widen is not None else []
            common.update(rank=rank - 1, frame=tuple(range(rank - 1)))  # the site reads and writes xin's layout
            return Match(
                kind="instance" if groups == channels else "group",
                input=xin,
                output=index.nodes[r_out].output[0],
                nodes=sorted(set(nodes + extra)),
                origin="",
                name="",
                channel_axis=c,
                groups=groups,
                dims=(channels,),
                scale=None if scale is None else scale.reshape(channels),
                bias=None if bias is None else bias.reshape(channels),
                **common,
            )
    if splits:
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
            kind="layer" if form.which == "V" else "rms",
            input=root,
            output=output,
            nodes=nodes,
            origin="",
            name="",
            axes=tuple(frame[p] for p in norm_positions),
            dims=dims,
            scale=scale,
            bias=bias,
            **common,
        )

    # InstanceNorm: statistics over every axis but batch and channel, per-channel affine.
    if form.which == "V":
        channel = [a for a in range(1, rank) if a not in axes]
        if len(channel) == 1 and axes == frozenset(range(1, rank)) - {channel[0]}:
            c = channel[0]
            position = inverse[c]
            if (
                _varies_only(form.scale, rank, {position})
                and _varies_only(form.bias, rank, {position})
                and isinstance(x_dims[c], int)
            ):
                size = (x_dims[c],)
                return Match(
                    kind="instance",
                    input=root,
                    output=output,
                    nodes=nodes,
                    origin="",
                    name="",
                    channel_axis=c,
                    dims=size,
                    scale=_squeeze_to(form.scale, rank, [position], size),
                    bias=_squeeze_to(form.bias, rank, [position], size),
                    **common,
                )
    return None


#: Float widths: a Cast to a narrower float rounds; one to a float as wide or wider is kept in the site, as before.
_WIDTH = {"bfloat16": 16, "float16": 16, "float32": 32, "float64": 64}


def _input_cast(index: GraphIndex, match: Match, claimed: set[int]) -> None:
    """Include a Cast that only widens the input for the statistics (normbridge's float16 graphs)."""
    i = index.producer.get(match.input)
    if i is None or i in claimed or index.nodes[i].op_type != "Cast":
        return
    source = index.nodes[i].input[0]
    users = set(index.consumer_nodes(match.input))
    if index.dtype(source) is None or not users <= set(match.nodes) or match.input in index.graph_outputs:
        return
    if _WIDTH.get(index.dtype(source), 0) > _WIDTH.get(index.dtype(match.input), 0):
        # a Cast that narrows (a mixed-precision layer's output cast before the next layer) rounds:
        # it stays in the graph
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
        match = ungroup(index, match, claimed) or match
        _input_cast(index, match, claimed)
        unflatten(index, match, claimed)
        runtime_affine(index, match, claimed)
        if set(match.nodes) & claimed:
            continue
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
