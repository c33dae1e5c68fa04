"""Reading what a group of aten ops computes: the normalization a hand-written module spells out.

A `NodeGroup` is the aten ops one module runs (from `torch.export` of the module alone, or the
nodes of a `.pt2` graph whose `nn_module_stack` names that module), with its one data input, its
one output and the parameters and buffers it reads. `derive` reads, from the structure alone,
the kind, the axes, eps, which state tensor is the scale (and a `1 + w` offset), the bias or the
frozen statistics, and the compute dtype (an upcast before the statistics). It never accepts
anything by itself: the caller proves the derived spec on a probe against the NumPy reference
(`norm_proof.py`) and rejects it when the outputs differ.

Spellings read: `rsqrt(stat + eps)` or `/ sqrt(stat + eps)` where stat is `mean(x^2)` (rms),
`var(x, correction=0)` or `mean((x - mean(x))^2)` (layer), or a buffer (FrozenBatchNorm:
`x * (w * rsqrt(rv + eps)) + (b - rm * scale)`); and one native op (`layer_norm`, `rms_norm`,
`batch_norm`, ...) on the input or on its channels-last permutation (ConvNeXt's channels_first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..torch_internals import op_name
from .aten_calls import OP_KINDS, _arguments

#: Ops that change no value (shape views, aliases) or only its dtype (casts).
CASTS = frozenset({"aten::to", "aten::_to_copy", "aten::type_as"})
VIEWS = frozenset(
    {
        "aten::view",
        "aten::reshape",
        "aten::_unsafe_view",
        "aten::unsqueeze",
        "aten::expand",
        "aten::alias",
        "aten::clone",
        "aten::detach",
        "aten::contiguous",
        "aten::squeeze",
        "aten::view_as",
        "aten::expand_as",
        "aten::lift_fresh_copy",
        "aten::slice",  # weight[:, None, None]; a slice that drops values is caught by the proof
    }
)
PASS = CASTS | VIEWS
#: Ops that produce nothing (checks torch.export inserts): ignored.
IGNORED = frozenset({"aten::_assert_tensor_metadata", "aten::_assert_scalar", "aten::sym_constrain_range_for_size"})
_TORCH_DTYPES = {
    "torch.bfloat16": "bfloat16",
    "torch.float16": "float16",
    "torch.float32": "float32",
    "torch.float64": "float64",
}


class NotANormalization(Exception):
    """The group's ops do not spell a normalization this reader knows; the message says what was found."""


@dataclass
class NodeGroup:
    """The aten ops of one module: `nodes` in graph order, its data input `x`, its output `out`, the state it reads."""

    nodes: list
    x: Any
    out: Any
    state: dict  # placeholder node -> state name relative to the module ("weight", "running_var")
    members: set = field(default_factory=set)

    def __post_init__(self):
        self.members = set(self.nodes)

    def users(self, node) -> list:
        return [u for u in node.users if u in self.members and op_name(u) not in IGNORED]

    def strip(self, node: Any) -> Any:
        """`strip` inside the group: it stops at the group's input (and at any other value it does not compute)."""
        return strip(node, self.members)


@dataclass(frozen=True)
class Derivation:
    """What a group computes: kind, spec fields, and which state tensor plays which spec role.

    `native` is the native op node when the kind's own op does the work (its arguments are read by
    the .pt2 reader for the kinds with running statistics or groups).
    """

    kind: str
    fields: dict
    roles: dict  # spec tensor name ("scale", "bias", "running_mean", "running_var") -> state name
    ops: tuple
    native: Any = None


def dtype_of(node: Any) -> str | None:
    value = node.meta.get("val") if hasattr(node, "meta") else None
    return _TORCH_DTYPES.get(str(getattr(value, "dtype", "")))


def shape_of(node: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in node.meta["val"].shape)


def strip(node: Any, members: set | None = None) -> Any:
    """`node` followed back through views and casts to the value they alias.

    With `members` (a module's nodes in a `.pt2` graph), only through views and casts among them: the module's input can
    itself be a view or cast its parent made (Qwen3's `q_norm(q_proj(x).view(...))`), and a walk past it would never
    meet the input.
    """
    while op_name(node) in PASS and (members is None or node in members):
        node = node.args[0]
    return node


def _scalar(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _add_scalar(node: Any) -> tuple[Any, float] | None:
    """(tensor operand, constant) of `t + c` or `c + t`, else None."""
    if op_name(node) not in ("aten::add", "aten::add_"):
        return None
    a, b = node.args[0], node.args[1]
    if _scalar(b) is not None and len(node.args) < 3:
        return a, _scalar(b)
    if _scalar(a) is not None:
        return b, _scalar(a)
    return None


def derive(group: NodeGroup) -> Derivation:
    """The normalization `group` computes, read from its ops; NotANormalization when it spells none."""
    ops = tuple(s for s in (op_name(n) for n in group.nodes) if s is not None and s not in IGNORED)
    native = [n for n in group.nodes if op_name(n) in OP_KINDS]
    if len(native) > 1:
        raise NotANormalization(f"it calls {len(native)} normalization ops ({', '.join(op_name(n) for n in native)})")
    if native:
        return _native(group, native[0], ops)
    return _decomposed(group, ops)


# -- a native op ---------------------------------------------------------------------


def _permuted_to_last(node: Any, rank: int) -> bool:
    """Axis 1 moved last: `permute(0, 2, ..., 1)`, or `transpose(1, -1)` (a LayerNorm over the channels alone computes
    the same whatever order the other axes take; the walk after it accepts the way back; the proof checks it)."""
    if op_name(node) == "aten::permute":
        return list(node.args[1]) == [0, *range(2, rank), 1]
    if op_name(node) == "aten::transpose" and len(node.args) >= 3:
        return sorted(int(d) % rank for d in node.args[1:3]) == [1, rank - 1]
    return False


def _native(group: NodeGroup, node: Any, ops: tuple) -> Derivation:
    kind = OP_KINDS[op_name(node)]
    a = _arguments(node)
    source = a["input"]
    rank = len(shape_of(group.x))
    permuted = _permuted_to_last(source, rank) and group.strip(source.args[0]) is group.x
    if not permuted and group.strip(source) is not group.x:
        raise NotANormalization(f"its {op_name(node)} reads a value computed from the input, not the input itself")
    if kind not in ("layer", "rms"):
        if permuted:
            raise NotANormalization(f"its {op_name(node)} reads a permuted input")
        _walk_after(group, node, None, None)  # nothing but views may follow (BatchNormAct's activation does)
        return Derivation(kind, {}, {}, ops, native=node)
    compute = _compute_dtype(group, source)
    roles, fields = {}, {"normalized_shape": tuple(int(d) for d in a["normalized_shape"]), "eps": a.get("eps")}
    for role in ("weight", "bias"):
        if a.get(role) is not None:
            name, offset = _state_source(group, a[role])
            roles["scale" if role == "weight" else "bias"] = name
            if role == "weight" and offset:
                fields["scale_offset"] = offset
    if permuted:
        if len(fields["normalized_shape"]) != 1:
            raise NotANormalization("it normalises a permuted input over more than its channel axis")
        fields["layout"] = "channels_first"
        fields["input_rank"] = rank
    _walk_after(group, node, compute, roles, fields, permuted=permuted)
    return Derivation(kind, _with_compute(fields, compute, group), roles, ops)


# -- written out -----------------------------------------------------------------------


def _inverse_std(group: NodeGroup) -> tuple[Any, Any]:
    """(the rsqrt or sqrt node, the value it multiplies or divides): the one place eps is added."""
    for node in group.nodes:
        s = op_name(node)
        if s == "aten::rsqrt":
            users = [u for u in _through_views(group, node) if op_name(u) == "aten::mul"]
        elif s == "aten::sqrt":
            users = [
                u for u in _through_views(group, node) if op_name(u) == "aten::div" and group.strip(u.args[1]) is node
            ]
        else:
            continue
        if users:
            return node, users[0]
    raise NotANormalization("it has no rsqrt or division by a sqrt")


def _through_views(group: NodeGroup, node: Any) -> list:
    """The first users of `node` that are not views or casts."""
    out = []
    for user in group.users(node):
        out.extend(_through_views(group, user) if op_name(user) in PASS else [user])
    return out


def _decomposed(group: NodeGroup, ops: tuple) -> Derivation:
    inverse, normalised = _inverse_std(group)
    added = _add_scalar(group.strip(inverse.args[0]))
    if added is None:
        raise NotANormalization("the value under its square root is not a statistic plus a constant eps")
    stat, eps = group.strip(added[0]), added[1]
    if stat in group.state:
        return _frozen_batch(group, inverse, group.state[stat], eps, ops)
    shape, rank = shape_of(group.x), len(shape_of(group.x))
    kind, source, dims = _statistic(group, stat, rank)
    dims = tuple(sorted(d % rank for d in dims))
    fields: dict[str, Any] = {"eps": eps}
    if dims == tuple(range(rank - len(dims), rank)):
        fields["normalized_shape"] = shape[rank - len(dims) :]
    elif dims == (1,) and rank >= 3:
        fields.update(normalized_shape=(shape[1],), layout="channels_first", input_rank=rank)
    else:
        raise NotANormalization(f"its statistics run over axes {list(dims)} of a rank-{rank} input")
    compute = _compute_dtype(group, source)
    roles: dict = {}
    _walk_after(group, normalised, compute, roles, fields)
    return Derivation(kind, _with_compute(fields, compute, group), roles, ops)


def _statistic(group: NodeGroup, stat: Any, rank: int) -> tuple[str, Any, list]:
    """(kind, the input value the statistic reads, its dims) of mean(x^2), var(x) or mean((x - mean x)^2)."""
    s = op_name(stat)
    if s == "aten::getitem" and op_name(stat.args[0]) == "aten::var_mean" and stat.args[1] == 0:
        stat, s = stat.args[0], "aten::var"
    if s == "aten::var":
        correction = stat.kwargs.get("correction", 1 if stat.kwargs.get("unbiased", True) else 0)
        if len(stat.args) > 2 and isinstance(stat.args[2], bool):
            correction = int(stat.args[2])
        if correction not in (0, 0.0):
            raise NotANormalization(
                f"its variance has correction={correction} (an unbiased variance), not the population variance"
            )
        source = stat.args[0]
        if group.strip(source) is not group.x:
            raise NotANormalization("its variance reads a value computed from the input")
        return "layer", source, list(stat.args[1] if len(stat.args) > 1 else stat.kwargs["dim"])
    if s != "aten::mean" or len(stat.args) < 2:
        raise NotANormalization(f"the statistic under its square root is {s}, not a mean or a variance")
    square = group.strip(stat.args[0])
    if op_name(square) == "aten::pow" and _scalar(square.args[1]) == 2.0:
        base = square.args[0]
    elif op_name(square) == "aten::mul" and square.args[0] is square.args[1]:
        base = square.args[0]
    else:
        raise NotANormalization("the mean under its square root is not a mean of squares")
    dims = list(stat.args[1])
    if group.strip(base) is group.x:
        return "rms", base, dims
    centred = group.strip(base)
    if (
        op_name(centred) == "aten::sub"
        and group.strip(centred.args[0]) is group.x
        and op_name(group.strip(centred.args[1])) == "aten::mean"
    ):
        mean = group.strip(centred.args[1])
        if group.strip(mean.args[0]) is group.x and sorted(d % rank for d in mean.args[1]) == sorted(
            d % rank for d in dims
        ):
            return "layer", centred.args[0], dims
    raise NotANormalization("the squares under its square root are not of the input or of the input minus its mean")


def _frozen_batch(group: NodeGroup, inverse: Any, running_var: str, eps: float, ops: tuple) -> Derivation:
    """x * (w * rsqrt(rv + eps)) + (b - rm * scale), or (x - rm) * rsqrt(rv + eps) * w + b: constants throughout."""
    roles = {"running_var": running_var}
    for node, name in group.state.items():
        if name == running_var:
            continue
        users = _through_views(group, node)
        if len(users) != 1:
            continue
        use = users[0]
        operands = [group.strip(a) for a in use.args[:2]]
        if op_name(use) == "aten::mul" and inverse in operands:
            roles["scale"] = name
        elif op_name(use) == "aten::mul" or (op_name(use) == "aten::sub" and operands[1] is node):
            roles["running_mean"] = name
        elif op_name(use) in ("aten::sub", "aten::add"):
            roles["bias"] = name
    if "running_mean" not in roles:
        raise NotANormalization("it divides by a buffer's square root but subtracts no running mean")
    shape = shape_of(group.x)
    fields = {
        "eps": eps,
        "num_features": shape[1],
        "spatial_rank": max(1, min(3, len(shape) - 2)),
        "layout": "channels_first",
        "input_rank": len(shape),
        "track_running_stats": True,
        "frozen": True,
    }
    return Derivation("batch", fields, roles, ops)


# -- after the normalisation -------------------------------------------------------------


def _state_source(group: NodeGroup, value: Any) -> tuple[str, float]:
    """(state name, offset) of a parameter read directly or as `w + c` (Gemma's `1.0 + weight`)."""
    node = group.strip(value)
    if node in group.state:
        return group.state[node], 0.0
    added = _add_scalar(node)
    if added is not None and group.strip(added[0]) in group.state:
        return group.state[group.strip(added[0])], added[1]
    raise NotANormalization(f"an affine operand ({getattr(value, 'name', value)}) is computed, not a parameter")


def _walk_after(
    group: NodeGroup,
    node: Any,
    compute: str | None,
    roles: dict | None,
    fields: dict | None = None,
    permuted: bool = False,
) -> None:
    """Follow the normalised value to the output, reading the elementwise scale and bias on the way.

    Anything else between them (an activation, a dropout that is not the identity) is not part of a normalization.
    """
    x_dtype = dtype_of(group.x)
    cast_seen = False
    while node is not group.out:
        users = group.users(node)
        if len(users) != 1:
            raise NotANormalization(f"its normalised value ({node.name}) is used {len(users)} times")
        user, s = users[0], op_name(users[0])
        if s in PASS or (permuted and s in ("aten::permute", "aten::transpose")):
            cast_seen = cast_seen or (s in CASTS and compute is not None and dtype_of(user) == x_dtype)
        elif roles is not None and s in ("aten::mul", "aten::add") and len(user.args) >= 2:
            other = user.args[1] if user.args[0] is node else user.args[0]
            name, offset = _state_source(group, other)
            role = "scale" if s == "aten::mul" else "bias"
            if role in roles or (role == "bias" and offset):
                raise NotANormalization(f"it applies a second {role} ({name})")
            roles[role] = name
            if offset:
                fields["scale_offset"] = offset
            if role == "scale" and cast_seen:
                fields["cast_before_affine"] = True
        else:
            raise NotANormalization(f"it computes {s} after the normalisation")
        node = user


def _compute_dtype(group: NodeGroup, source: Any) -> str | None:
    """The dtype the statistics are computed in, when the module casts its input to another one first."""
    inner, outer = dtype_of(source), dtype_of(group.x)
    return inner if inner is not None and inner != outer else None


def _with_compute(fields: dict, compute: str | None, group: NodeGroup) -> dict:
    if compute is not None:
        fields["compute_dtype"] = compute
    else:
        fields.pop("cast_before_affine", None)
    return fields
