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

from .index import GraphIndex, attribute, same_shape, shape_chain
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
        if len(other) != 1 or other[0] in index.constants or _depends_on(index, other[0], match.input) or not _per_feature(index, other[0], match):
            continue
        match.nodes = sorted(set(match.nodes) | {i})
        match.output = node.output[0]
        match.affine_inputs = match.affine_inputs + (other[0],)


def unflatten(index: GraphIndex, match: Match, claimed: set[int]) -> None:
    """A layer/rms match over axis 1 of Flatten(X, a) that is reshaped back to X's shape becomes a match over X's axes a.."""
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
        return  # a = 0 normalises the whole tensor (ONNX's axis=0), which the spec holds as normalized_shape = X's shape
    runtime_affine(index, match, claimed)
    r = index.single_consumer(match.output)
    if r is None or r in claimed or index.nodes[r].op_type != "Reshape" or not same_shape(index, index.nodes[r].input[1], x):
        return
    shape = tuple(int(d) for d in normalized)
    match.nodes = sorted(set(match.nodes) | {f, r} | set(shape_chain(index, index.nodes[r].input[1])))
    match.input, match.output = x, index.nodes[r].output[0]
    match.rank, match.frame, match.axes, match.dims = rank, tuple(range(rank)), tuple(range(a, rank)), shape
    match.scale = None if match.scale is None else np.ascontiguousarray(match.scale.reshape(shape))
    match.bias = None if match.bias is None else np.ascontiguousarray(match.bias.reshape(shape))
