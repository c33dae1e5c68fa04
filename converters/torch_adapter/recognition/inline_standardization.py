"""A standardization written inline in a module that does other work: `(x - mean) / sqrt(var + eps)` among other ops.

PatchTST's `PatchTSTStdScaler` (and the same scaler in PatchTSMixer, TimeSeriesTransformer, Informer, Autoformer)
computes an instance normalization over time inline, with a mask and three outputs; its class name does not say "Norm"
and it keeps no weight, so no name rule makes it a candidate. In a `.pt2` program its ops are found here by what they
compute: a division by the square root of a statistic (a sum, mean or variance, possibly divided by a count) plus a
constant, or a multiplication by the rsqrt of one. Such a module is then a candidate like any other
(`exported_computed.py`): proved when its ops read as a normalization, otherwise reported as an unrecognised
normalization (issue 34, item 2). A statistic of a parameter (weight standardization, `data_flow.py`) is not one.
"""

from __future__ import annotations

from typing import Any

from ..torch_internals import op_name
from .data_flow import reads_a_parameter
from .norm_graph import PASS, _add_scalar, strip

#: Reductions a standardization's statistic is computed with.
REDUCTIONS = frozenset({"aten::mean", "aten::sum", "aten::var", "aten::var_mean", "aten::std", "aten::std_mean"})
#: Ops between a weight and the reduction in a written-out weight standardization: `(w - mean(w)) ** 2`.
_CENTRING = frozenset({"aten::sub", "aten::pow", "aten::mul"})
#: How many divisions or products (a sum divided by a count) may lie between the reduction and the added constant.
_DEPTH = 3


def standardization_in(program: Any, nodes: list) -> str | None:
    """Why `nodes` (one module's own ops in `program`) standardize a value, or None."""
    for node in nodes:
        name = op_name(node)
        if name not in ("aten::sqrt", "aten::rsqrt"):
            continue
        added = _add_scalar(strip(node.args[0]))
        if added is None:
            continue
        reduction = _reduction(added[0], _DEPTH)
        if reduction is None or _of_a_weight(program, reduction):
            continue
        if any(_applies(name, node, user) for user in _users(node)):
            return f"it divides by the square root of a statistic of its input plus {added[1]:g}"
    return None


def _reduction(node: Any, depth: int) -> Any:
    """The reduction a statistic is computed with (through up to `depth` divisions or products), or None."""
    node = strip(node)
    name = op_name(node)
    if name == "aten::getitem":
        paired = op_name(strip(node.args[0])) in ("aten::var_mean", "aten::std_mean")
        return _reduction(node.args[0], 0) if paired else None
    if name in REDUCTIONS:
        return node
    if depth and name in ("aten::div", "aten::mul"):
        found = (_reduction(arg, depth - 1) for arg in node.args[:2] if hasattr(arg, "op"))
        return next((r for r in found if r is not None), None)
    return None


def _of_a_weight(program: Any, reduction: Any) -> bool:
    """The statistic reduces a parameter (`w`, `w * w`, `(w - mean(w)) ** 2`): weight standardization (data_flow.py)."""
    return reads_a_parameter(program, reduction.args[0], through=_CENTRING, depth=2)


def _users(node: Any) -> list:
    """The first users of `node` that are not views or casts."""
    out = []
    for user in node.users:
        out.extend(_users(user) if op_name(user) in PASS else [user])
    return out


def _applies(name: str, root: Any, user: Any) -> bool:
    """A sqrt divides a value, an rsqrt multiplies one."""
    if name == "aten::sqrt":
        return op_name(user) == "aten::div" and len(user.args) > 1 and strip(user.args[1]) is root
    return op_name(user) == "aten::mul"


__all__ = ["standardization_in"]
