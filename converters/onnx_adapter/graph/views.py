"""Normalizations read in a reshaped view of their input, and affine factors that are not constants.

ONNX's own function bodies (the `_expanded` node tests, and what a backend that inlines functions
writes) compute LayerNormalization on `Flatten(X, axis)`, a 2-D view whose axis 1 holds every
normalised axis, and reshape the result back to X's shape. `moments` reads the statistics in that
view; `unflatten` turns such a match back into X's axes. A scale or bias that is a graph input or
is computed at run time (the node tests feed W and B as inputs) is part of the layer but has no
value to read: `runtime_affine` takes it into the match and names it, so the site is listed with
its kind, axes and eps, and its spec is refused instead of being read as "no scale".
"""

from __future__ import annotations

import numpy as np

from .index import GraphIndex, attribute, resolve_reshape, same_shape, shape_chain
from .match import Match


def _depends_on(index: GraphIndex, tensor: str, root: str, limit: int = 64) -> bool:
    """Whether `tensor` is computed from `root` (a bounded walk up the producers)."""
    stack, seen = [tensor], set()
    while stack and len(seen) < limit:
        name = stack.pop()
        if name == root:
            return True
        if name in seen or name in index.constants:
            continue
        seen.add(name)
        node = index.producer_node(name)
        if node is not None:
            stack.extend(n for n in node.input if n)
    return False


def _per_feature(index: GraphIndex, tensor: str, match: Match) -> bool:
    """`tensor` has the shape of the normalised axes (1 elsewhere): the shape a layer's scale or bias has."""
    shape, x_dims = index.dims(tensor), index.dims(match.input)
    if shape is None or x_dims is None or match.axes is None or len(shape) > len(x_dims):
        return False
    padded = (1,) * (len(x_dims) - len(shape)) + tuple(shape)
    return all(d == (x_dims[p] if p in match.axes else 1) for p, d in enumerate(padded))


def runtime_affine(index: GraphIndex, match: Match, claimed: set[int]) -> None:
    """Extend a layer/rms `match` over a following Mul and Add by per-feature operands that are not constants and do not
    depend on its input (graph inputs, or computed from them)."""
    if match.kind not in ("layer", "rms"):
        return
    for op, present in (("Mul", match.scale is not None), ("Add", match.bias is not None)):
        i = index.single_consumer(match.output)
        if present or i is None or i in claimed or index.nodes[i].op_type != op or len(index.nodes[i].input) != 2:
            continue
        node = index.nodes[i]
        other = [n for n in node.input if n != match.output]
        if (
            len(other) != 1
            or other[0] in index.constants
            or _depends_on(index, other[0], match.input)
            or not _per_feature(index, other[0], match)
        ):
            continue
        match.nodes = sorted(set(match.nodes) | {i})
        match.output = node.output[0]
        match.affine_inputs = match.affine_inputs + (other[0],)


def unflatten(index: GraphIndex, match: Match, claimed: set[int]) -> None:
    """A layer/rms match over axis 1 of Flatten(X, a) that is reshaped back to X's shape becomes a match over X's axes
    a.."""
    if match.kind not in ("layer", "rms") or match.rank != 2 or match.axes != (1,):
        return
    f = index.producer.get(match.input)
    if f is None or f in claimed or index.nodes[f].op_type != "Flatten":
        return
    x = index.nodes[f].input[0]
    dims = index.dims(x)
    if dims is None:
        return
    rank = len(dims)
    a = attribute(index.nodes[f], "axis", 1)
    a = a + rank if a < 0 else a
    normalized = dims[a:]
    if not normalized or not all(isinstance(d, int) for d in normalized):
        # a = 0 normalises the whole tensor (ONNX's axis=0), which the spec holds as normalized_shape = X's shape
        return
    runtime_affine(index, match, claimed)
    r = index.single_consumer(match.output)
    if (
        r is None
        or r in claimed
        or index.nodes[r].op_type != "Reshape"
        or not same_shape(index, index.nodes[r].input[1], x)
    ):
        return
    shape = tuple(int(d) for d in normalized)
    match.nodes = sorted(set(match.nodes) | {f, r} | set(shape_chain(index, index.nodes[r].input[1])))
    match.input, match.output = x, index.nodes[r].output[0]
    match.rank, match.frame, match.axes, match.dims = rank, tuple(range(rank)), tuple(range(a, rank)), shape
    match.scale = None if match.scale is None else np.ascontiguousarray(match.scale.reshape(shape))
    match.bias = None if match.bias is None else np.ascontiguousarray(match.bias.reshape(shape))


def _reshape_to(index: GraphIndex, tensor: str, claimed: set[int], target=None, like: str | None = None) -> int | None:
    """The Reshape consuming `tensor` alone, to the constant `target` or to the shape of `like`."""
    r = index.single_consumer(tensor)
    if r is None or r in claimed or index.nodes[r].op_type != "Reshape":
        return None
    shape = index.nodes[r].input[1]
    if like is not None:
        return r if same_shape(index, shape, like) else None
    return r if index.int_values(shape) == target else None


def _channel_affine(index: GraphIndex, tensor: str, channels: int, claimed: set[int], nodes: list[int]):
    """(scale, bias, runtime operands, output) of the per-channel Mul and Add after `tensor`
    (rank 3, channel axis 1)."""
    from .channels import _affine_step

    found: dict[str, object] = {}
    runtime: list[str] = []
    for op in ("Mul", "Add"):
        step = _affine_step(index, tensor, op, 3, channels)
        if step is not None and step[0] not in claimed:
            found[op] = step[1]
        else:
            i = index.single_consumer(tensor)
            if i is None or i in claimed or index.nodes[i].op_type != op:
                continue
            other = [n for n in index.nodes[i].input if n != tensor]
            dims = index.dims(other[0]) if len(other) == 1 else None
            if (
                dims is None
                or other[0] in index.constants
                or int(np.prod([d for d in dims if isinstance(d, int)])) != channels
            ):
                continue
            runtime.append(other[0])
            step = (i, None)
        nodes.append(step[0])
        tensor = index.nodes[step[0]].output[0]
    return found.get("Mul"), found.get("Add"), tuple(runtime), tensor


def ungroup(index: GraphIndex, match: Match, claimed: set[int]) -> Match | None:
    """ONNX's GroupNormalization body: statistics over axis 2 of X reshaped to (N, G, C/G, ...) then (N, G, -1),
    the result reshaped back to X's shape, to (N, C, -1) for the per-channel affine, and to X's shape again."""
    if (
        match.kind != "layer"
        or match.rank != 3
        or match.axes != (2,)
        or match.scale is not None
        or match.bias is not None
    ):
        return None
    flat = index.producer.get(match.input)
    if (
        flat is None
        or index.nodes[flat].op_type != "Reshape"
        or index.int_values(index.nodes[flat].input[1]) != [0, 0, -1]
    ):
        return None
    split = reshape_split(index, index.nodes[flat].input[0])
    if split is None or split[2] != 1:
        return None
    r_in, xin, _, groups, channels = split
    nodes = list(match.nodes) + [flat, r_in] + shape_chain(index, index.nodes[r_in].input[1])
    back = _reshape_to(index, match.output, claimed, like=xin)
    if back is None:
        return None
    per_channel = _reshape_to(index, index.nodes[back].output[0], claimed, target=[0, 0, -1]) or _reshape_to(
        index, index.nodes[back].output[0], claimed, target=[0, channels, -1]
    )
    if per_channel is None:
        return None
    tensor = index.nodes[per_channel].output[0]
    cast = index.single_consumer(tensor)
    nodes += [back, per_channel] + shape_chain(index, index.nodes[back].input[1])
    if cast is not None and index.nodes[cast].op_type == "Cast" and cast not in claimed:
        nodes.append(cast)
        tensor = index.nodes[cast].output[0]
    scale, bias, runtime, tensor = _channel_affine(index, tensor, channels, claimed, nodes)
    final = _reshape_to(index, tensor, claimed, like=xin)
    if final is None:
        return None
    nodes.append(final)
    dims = index.dims(xin)
    return Match(
        kind="instance" if groups == channels else "group",
        native=False,
        origin="",
        name="",
        nodes=sorted(set(nodes)),
        input=xin,
        output=index.nodes[final].output[0],
        eps=match.eps,
        dtype=index.dtype(xin),
        rank=len(dims),
        frame=tuple(range(len(dims))),
        channel_axis=1,
        groups=groups,
        dims=(channels,),
        scale=scale,
        bias=bias,
        affine_inputs=runtime,
    )


def reshape_split(index: GraphIndex, x5: str):
    """(Reshape node index, xin, axis c, groups, channels) when x5 = Reshape(xin) splits axis c of xin into (G, C/G)."""
    splits = reshape_splits(index, x5)
    return splits[0] if splits else None


def reshape_splits(index: GraphIndex, x5: str) -> list:
    """Every reading of x5 = Reshape(xin) as a split of one axis c of xin into (G, C/G), lowest c first: a size-1 axis
    inserted between two axes reads both as (d, 1) of the axis before and as (1, d) of the axis after (Keras's
    GroupNormalization(groups=1) reshapes (N, H, W, C) to (N, H, W, 1, C)); the axes the statistics cover tell which."""
    i = index.producer.get(x5)
    if i is None or index.nodes[i].op_type != "Reshape":
        return []
    node = index.nodes[i]
    xin = node.input[0]
    source = index.dims(xin)
    target = index.int_values(node.input[1])
    if source is None or target is None or len(target) != len(source) + 1:
        return []
    target = resolve_reshape(target, source, attribute(node, "allowzero", 0))
    if target is None:
        return []
    splits = []
    for c in range(1, len(source)):
        channels, groups, per_group = source[c], target[c], target[c + 1]
        if (
            not all(isinstance(d, int) for d in (channels, groups, per_group))
            or groups < 1
            or groups * per_group != channels
        ):
            continue
        rest = list(source[:c]) + list(source[c + 1 :])
        others = list(target[:c]) + list(target[c + 2 :])
        if others.count(-1) <= 1 and all(d == r for d, r in zip(others, rest) if d != -1):
            splits.append((i, xin, c, groups, channels))
    return splits
