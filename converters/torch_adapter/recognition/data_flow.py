"""Whether a value a normalization reads is one of the model's parameters: it then normalizes a weight, not an
activation.

BiT's `WeightStandardizedConv2d` calls `F.batch_norm(self.weight.reshape(1, out, -1), None, None, training=True)` on its
own kernel (weight standardization; timm's `StdConv2d` and `ScaledStdConv2d` do the same, others write out
`(w - w.mean(...)) / sqrt(w.var(...) + eps)`). That holds no statistics, takes no part in what a request's batch does to
another, and no converter ever sees it as a layer: it is part of the convolution's weight. So neither the native-op
reader nor the hand-written module reader lists it (issue 34, item 1). Only a parameter, buffer or constant read through
views and casts counts: a value computed from the state alone is still an activation (DETR's first decoder layer
normalizes its learned queries before any image feature reaches them).
"""

from __future__ import annotations

from typing import Any

from ..torch_internals import op_name
from .norm_graph import PASS


def reads_a_parameter(program: Any, value: Any, through: frozenset = frozenset(), depth: int = 0) -> bool:
    """True when `value` (an op argument) is a parameter, buffer or constant of `program` seen through views and casts;
    with `through` and `depth`, also through up to `depth` ops of `through` on their first operand (`w - mean(w)`)."""
    node = value
    while op_name(node) in PASS or (depth and op_name(node) in through):
        if op_name(node) not in PASS:
            depth -= 1
        node = node.args[0]
        if not hasattr(node, "op"):
            return False
    if getattr(node, "op", None) != "placeholder":
        return False
    return node.name not in set(program.graph_signature.user_inputs)


__all__ = ["reads_a_parameter"]
