"""Channel-wise decompositions that are not moments: torch.onnx's GroupNorm and tf2onnx's folded BatchNorm.

- torch.onnx (and normbridge) write GroupNorm below opset 21 as Reshape to (N, G, -1),
  InstanceNormalization with unit scale and zero bias, Reshape back, per-channel Mul and Add.
- tf2onnx folds an eval BatchNorm into `x * k + o` with k = gamma / sqrt(var + eps) and
  o = beta - mean * k, per channel: eps and the statistics are gone, so only TF's `batchnorm/`
  name scope says what it was (or, in the rewrite, the source model's specs).
"""

from __future__ import annotations

import numpy as np

from schemas.floats import is_float_dtype
from schemas.kinds import KIND_INFO

from .index import GraphIndex, attribute, same_shape, shape_chain
from .match import Match, origin_of, recover_eps, site_name

INSTANCE = KIND_INFO["instance"]


def _per_channel(array: np.ndarray | None, rank: int, axis: int) -> np.ndarray | None:
    """The per-channel values of a constant broadcast along `axis` of a rank-`rank` tensor, else None."""
    if array is None or array.ndim > rank or array.size < 1:
        return None
    padded = array.reshape((1,) * (rank - array.ndim) + array.shape)
    if any(padded.shape[p] != 1 for p in range(rank) if p != axis):
        return None
    return np.ascontiguousarray(padded.reshape(-1))


def _affine_step(index: GraphIndex, tensor: str, op: str, rank: int, channels: int):
    """(node index, per-channel constant) when `tensor`'s only consumer applies a per-channel `op`."""
    i = index.single_consumer(tensor)
    if i is None or index.nodes[i].op_type != op:
        return None
    node = index.nodes[i]
    operands = [n for n in node.input if n != tensor]
    if len(operands) != 1 or list(node.input).count(tensor) != 1:
        return None
    values = _per_channel(index.constant(operands[0]), rank, 1)
    if values is None or values.size not in (1, channels):
        return None
    return i, np.broadcast_to(values, (channels,)).copy()


def _channel_reshape(index: GraphIndex, tensor: str, channels: int | None) -> int | None:
    """The node reshaping `tensor` (its only consumer) to the constant [0, C, -1] (C = `channels` when known)."""
    r = index.single_consumer(tensor)
    if r is None or index.nodes[r].op_type != "Reshape":
        return None
    target = index.int_values(index.nodes[r].input[1])
    if (
        target is None
        or len(target) != 3
        or target[0] != 0
        or target[2] != -1
        or index.nodes[r].input[1] not in index.constants
    ):
        return None
    if not isinstance(target[1], int) or target[1] < 1 or (channels is not None and target[1] != channels):
        return None
    return r


def _affine_steps(
    index: GraphIndex, nodes: list[int], output: str, rank: int, channels: int
) -> tuple[dict[str, np.ndarray], str]:
    """The per-channel Mul and Add following `output` (appended to `nodes`), by op, and the last output."""
    affine = {}
    for op in ("Mul", "Add"):
        step = _affine_step(index, output, op, rank, channels)
        if step is None:
            continue
        affine[op] = step[1]
        nodes.append(step[0])
        output = index.nodes[step[0]].output[0]
    return affine, output


def match_grouped_instance_norm(index: GraphIndex, i: int, claimed: set[int]) -> Match | None:
    """GroupNorm as Reshape(x, [0, G, -1]) -> InstanceNormalization(ones, zeros) -> Reshape(shape(x)) -> Mul -> Add
    (torch.onnx), or -> Reshape(x, [0, C, -1]) -> Mul -> Add -> Reshape(shape(x)) (normbridge, any rank)."""
    node = index.nodes[i]
    if node.op_type != INSTANCE.onnx_op or i in claimed or len(node.input) < 3:
        return None
    r_in = index.producer.get(node.input[0])
    if r_in is None or index.nodes[r_in].op_type != "Reshape" or r_in in claimed:
        return None
    xin = index.nodes[r_in].input[0]
    dims = index.dims(xin)
    target = index.int_values(index.nodes[r_in].input[1])
    if target is None or len(target) != 3 or (dims is not None and len(dims) < 2):
        return None
    groups = target[1]
    known = dims[1] if dims is not None and isinstance(dims[1], int) else None
    if (
        target[0] not in (0, None if dims is None else dims[0])
        or not isinstance(groups, int)
        or groups < 1
        or target[2] not in (-1, None)
    ):
        return None
    scale, bias = index.constant(node.input[1]), index.constant(node.input[2])
    if (
        scale is None
        or bias is None
        or scale.shape != (groups,)
        or bias.shape != (groups,)
        or not (np.all(scale == 1) and np.all(bias == 0))
    ):
        return None
    inner = _channel_reshape(index, node.output[0], known)
    if inner is not None:  # normbridge: the affine on (N, C, -1), then back to X's shape (any rank >= 2)
        channels = int(index.int_values(index.nodes[inner].input[1])[1])
        nodes, output = [r_in, i, inner], index.nodes[inner].output[0]
        affine, output = _affine_steps(index, nodes, output, 3, channels)
        r_out = index.single_consumer(output)
        if (
            r_out is None
            or index.nodes[r_out].op_type != "Reshape"
            or not same_shape(index, index.nodes[r_out].input[1], xin)
        ):
            return None
        nodes += [r_out] + shape_chain(index, index.nodes[r_out].input[1])
        output = index.nodes[r_out].output[0]
    else:  # torch.onnx: back to X's shape, then the affine over (C, 1, ..., 1), which needs X's rank
        if dims is None or len(dims) < 3 or known is None:
            return None
        channels = known
        r_out = index.single_consumer(node.output[0])
        if (
            r_out is None
            or index.nodes[r_out].op_type != "Reshape"
            or not same_shape(index, index.nodes[r_out].input[1], xin)
        ):
            return None
        nodes = [r_in, i, r_out] + shape_chain(index, index.nodes[r_out].input[1])
        affine, output = _affine_steps(index, nodes, index.nodes[r_out].output[0], len(dims), channels)
    if channels % groups:
        return None
    if set(nodes) & claimed:
        return None
    eps = attribute(node, "epsilon", INSTANCE.default_eps["onnx"])
    dtype = index.dtype(xin)
    match = Match(
        kind="group",
        native=False,
        origin=origin_of(index, nodes),
        name="",
        nodes=sorted(set(nodes)),
        input=xin,
        output=output,
        eps=recover_eps(eps, "float32"),
        dtype=dtype,
        rank=None if dims is None else len(dims),
        frame=None if dims is None else tuple(range(len(dims))),
        channel_axis=1,
        groups=groups,
        dims=(channels,),
        scale=affine.get("Mul"),
        bias=affine.get("Add"),
    )
    match.name = site_name(index, match.nodes, output)
    return match


# -- tf2onnx's folded BatchNorm -------------------------------------------------------------


def folded_candidate(index: GraphIndex, i: int, claimed: set[int]) -> Match | None:
    """A Mul by a per-channel constant followed by an Add of one (channel axis 1, or last):
    a folded BatchNorm's shape."""
    node = index.nodes[i]
    if node.op_type != "Mul" or i in claimed or not index.default_domain(i):
        return None
    constant = [n for n in node.input if n in index.constants]
    data = [n for n in node.input if n not in index.constants]
    if len(constant) != 1 or len(data) != 1:
        return None
    rank = index.rank(data[0])
    k = index.constant(constant[0])
    if rank is None or rank < 2 or not is_float_dtype(k.dtype) or k.ndim > rank or k.size < 2:
        return None
    padded = k.reshape((1,) * (rank - k.ndim) + k.shape)
    wide = [p for p in range(rank) if padded.shape[p] != 1]
    if len(wide) != 1 or wide[0] not in (1, rank - 1):
        return None
    axis = wide[0]
    channels = padded.shape[axis]
    nodes, output, offset = [i], node.output[0], None
    j = index.single_consumer(output)
    if j is not None and index.nodes[j].op_type in ("Add", "Sub") and j not in claimed:
        add = index.nodes[j]
        others = [n for n in add.input if n != output]
        if len(others) == 1 and list(add.input).count(output) == 1 and others[0] in index.constants:
            b = _per_channel(index.constant(others[0]), rank, axis)
            if b is not None and b.size == channels and (add.op_type == "Add" or add.input[0] == output):
                offset = b if add.op_type == "Add" else -b
                nodes.append(j)
                output = add.output[0]
    return Match(
        kind="batch",
        native=False,
        origin="tf2onnx",
        name="",
        nodes=nodes,
        input=data[0],
        output=output,
        dtype=index.dtype(data[0]),
        rank=rank,
        frame=tuple(range(rank)),
        channel_axis=axis,
        dims=(channels,),
        folded=True,
        folded_constants=(np.ascontiguousarray(padded.reshape(-1)), offset),
    )


def match_folded_by_name(index: GraphIndex, i: int, claimed: set[int]) -> Match | None:
    """A folded BatchNorm whose Mul and Add keep TF's `batchnorm/` name scope (tf2onnx, from Keras)."""
    match = folded_candidate(index, i, claimed)
    if match is None or len(match.nodes) != 2 or not all("batchnorm/" in index.nodes[n].name for n in match.nodes):
        return None
    names = [index.nodes[n].name.split("/batchnorm/")[0] for n in match.nodes]
    match.name = names[0]
    return match
