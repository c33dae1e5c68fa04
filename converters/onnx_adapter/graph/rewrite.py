"""Rewriting decomposed normalizations into the native ONNX ops, with the exact eps.

A decomposition computes the same function as the native op, but a serving runtime cannot
fuse it, a verifier cannot read its eps, and tf2onnx's folded BatchNorm has lost eps and the
running statistics altogether. Each recognised site is replaced by one native node
(LayerNormalization-17, RMSNormalization-23, GroupNormalization-21 per channel,
InstanceNormalization, BatchNormalization) where the allowed opset has it; sites whose op
needs a newer opset than allowed stay as they are. A site whose data is channels-last (tf2onnx
keeps Keras's layout) gets Transposes around the native op, cancelled against the Transposes
already in the graph wherever they are inverse, so the function is unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from schemas import NormSpec
from schemas.floats import as_float32, is_float_dtype
from schemas.kinds import KIND_INFO

from .channels import folded_candidate
from .match import Match
from .patterns import find_matches
from ..proto import opset_of
from .index import GraphIndex, attribute, fresh_name, subgraph_reads
from .sites import NormSite, require_model, site_of, spec_of_match

#: Relative tolerance of a folded BatchNorm's constants against the ones recomputed from a spec:
#: TF folds them in float32 (rsqrt, a product and a difference), a few ulps at most.
FOLD_ULPS = 16 * 2.0**-24
#: The same for constants a bfloat16/float16 model folds in its own dtype (DETR's frozen BatchNorm computes
#: `w * (rv + eps).rsqrt()` and `b - rm * scale` in bfloat16): a few roundings of that dtype, 4 ulps at most.
FOLD_TOLERANCE = {"float32": FOLD_ULPS, "float64": FOLD_ULPS, "float16": 4 * 2.0**-11, "bfloat16": 4 * 2.0**-8}


def rewrite_decompositions(
    model: onnx.ModelProto, opset: int, source_specs: list[NormSpec] | None = None
) -> tuple[onnx.ModelProto, list[NormSite]]:
    """A new model with each recognised decomposition replaced by the native op (the input is untouched).

    Args:
        model: the graph to rewrite.
        opset: the highest opset the result may import; the model's opset is raised up to it
            (with onnx's version converter) only when a site needs it.
        source_specs: the source model's normalization specs in order; with them, tf2onnx's
            folded BatchNorms are matched (by their folded constants) to the batch specs and
            replaced by BatchNormalization nodes carrying the specs' exact tensors and eps.

    Returns:
        The rewritten model and the sites that were rewritten (as found before the rewrite).
    """
    original = require_model(model)
    result = onnx.ModelProto()
    result.CopyFrom(original)
    current = _opset(result)
    index = GraphIndex(result)
    plans = _plans(index, source_specs, limit=opset)
    needed = max((KIND_INFO[m.kind].onnx_opset for m, _ in plans), default=current)
    if needed > current:
        converted = _convert(result, needed)
        if converted is None:
            plans = [(m, s) for m, s in plans if KIND_INFO[m.kind].onnx_opset <= current]
        else:
            result, index = converted, GraphIndex(converted)
            plans = _plans(index, source_specs, limit=needed)
    if not plans:
        return result, []
    sites = [
        site_of(index, match, spec=spec if spec is not None else spec_of_match(index, match)) for match, spec in plans
    ]
    _apply(result, index, plans)
    onnx.checker.check_model(result)
    return result, sites


# -- what to rewrite ------------------------------------------------------------------------------


def _opset(model: onnx.ModelProto) -> int:
    return opset_of(model)


def _rewritable(match: Match, limit: int) -> bool:
    if (
        match.native
        or not KIND_INFO[match.kind].native_in(limit)
        or match.dtype is None
        or match.rank is None
        or match.eps is None
    ):
        return False
    if KIND_INFO[match.kind].trailing:
        return match.dims is not None and match.axes is not None
    return match.channel_axis is not None and match.dims is not None


def _plans(index: GraphIndex, source_specs: list[NormSpec] | None, limit: int) -> list[tuple[Match, NormSpec | None]]:
    """(match, spec) pairs to rewrite: decompositions, and folded BatchNorms matched to a source spec."""
    matches = find_matches(index)
    plans: list[tuple[Match, NormSpec | None]] = [(m, None) for m in matches if not m.folded and _rewritable(m, limit)]
    if source_specs is not None and KIND_INFO["batch"].onnx_opset <= limit:
        claimed = {i for m in matches if not m.folded for i in m.nodes}
        plans += _folded_plans(index, [s for s in source_specs if s.kind == "batch"], claimed)
    return sorted(plans, key=lambda plan: plan[0].start)


def _folded_plans(index: GraphIndex, specs: list[NormSpec], claimed: set[int]) -> list[tuple[Match, NormSpec]]:
    """Folded BatchNorms in graph order, each paired with an unused batch spec whose folded constants agree.

    The spec named like the site wins; otherwise the first unused one in source order. Exporters
    may order parallel branches differently from the source (a ResNet block's shortcut and main
    path), so a strict in-order cursor would skip layers whose constants differ.
    """
    plans, unused = [], list(range(len(specs)))
    for i in range(len(index.nodes)):
        if not unused:
            break
        match = folded_candidate(index, i, claimed)
        if match is None:
            continue
        agreeing = [
            p for p in unused if _folds_in(specs[p], match.dtype) and folded_agrees(specs[p], *match.folded_constants)
        ]
        if not agreeing:
            continue
        site_name = _folded_name(index, match)
        position = next((p for p in agreeing if specs[p].name == site_name), agreeing[0])
        spec = specs[position]
        match.eps, match.name = spec.eps, site_name or spec.name
        plans.append((match, spec))
        claimed.update(match.nodes)
        unused.remove(position)
    return plans


def _folds_in(spec: NormSpec, dtype: str | None) -> bool:
    """Whether a folded BatchNorm in `dtype` may be `spec`'s: its own dtype, or float32 for a float16/bfloat16 layer,
    which Keras computes in float32 (BatchNormalization.call casts input and state up, a mixed policy or not; widening
    is exact)."""
    return dtype == spec.dtype or (dtype == "float32" and spec.dtype in ("float16", "bfloat16"))


def _folded_name(index: GraphIndex, match: Match) -> str | None:
    names = [index.nodes[i].name for i in match.nodes]
    if names and all("batchnorm/" in n for n in names):
        return names[0].split("/batchnorm/")[0]
    return None


def folded_constants(spec: NormSpec) -> tuple[np.ndarray, np.ndarray]:
    """(k, offset) in float64 of an eval BatchNorm folded into `x * k + offset`: k = gamma / sqrt(var + eps),
    offset = beta - mean * k."""
    tensors = spec.tensors
    count = spec.num_features
    gamma = tensors["scale"].astype(np.float64) if spec.scale else np.ones(count)
    beta = tensors["bias"].astype(np.float64) if spec.bias else np.zeros(count)
    inv = gamma / np.sqrt(tensors["running_var"].astype(np.float64) + spec.eps)
    return inv, beta - tensors["running_mean"].astype(np.float64) * inv


def folded_agrees(spec: NormSpec, k: np.ndarray, offset: np.ndarray | None) -> bool:
    """Whether `x * k + offset` is `spec`'s eval BatchNorm folded in float32 (offset None: an omitted zero Add)."""
    if not spec.track_running_stats or spec.training or spec.num_features != k.size:
        return False
    count = spec.num_features
    beta = spec.tensors["bias"].astype(np.float64) if spec.bias else np.zeros(count)
    mean = spec.tensors["running_mean"].astype(np.float64)
    inv, expected = folded_constants(spec)
    tiny = float(np.finfo(np.float32).tiny)
    ulps = FOLD_TOLERANCE.get(spec.dtype, FOLD_ULPS)
    if not np.all(np.abs(k.astype(np.float64) - inv) <= ulps * np.abs(inv) + tiny):
        return False
    found = np.zeros(count) if offset is None else offset.astype(np.float64)
    return bool(np.all(np.abs(found - expected) <= ulps * (np.abs(beta) + np.abs(mean * inv)) + tiny))


def _convert(model: onnx.ModelProto, target: int) -> onnx.ModelProto | None:
    """The model at opset `target` (onnx's version converter), or None when it cannot convert it."""
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, target)
        onnx.checker.check_model(converted)
    # the converter raises RuntimeError/ValidationError/InferenceError for ops it cannot move
    except Exception:  # noqa: BLE001
        return None
    # The converter drops node metadata (torch.onnx's module scopes name the sites): put it back by node name.
    metadata = {node.name: node.metadata_props for node in model.graph.node if node.name and len(node.metadata_props)}
    for node in converted.graph.node:
        if node.name in metadata and not len(node.metadata_props):
            node.metadata_props.extend(metadata[node.name])
    converted.ir_version = max(converted.ir_version, helper.find_min_ir_version_for(list(converted.opset_import)))
    return converted


# -- emitting ---------------------------------------------------------------------------------


class _Names:
    """Fresh tensor and node names that collide with nothing in the graph."""

    def __init__(self, model: onnx.ModelProto):
        graph = model.graph
        self.taken = {t.name for t in graph.initializer} | {
            v.name for v in list(graph.input) + list(graph.output) + list(graph.value_info)
        }
        for node in graph.node:
            self.taken.update(node.input)
            self.taken.update(node.output)
            self.taken.add(node.name)

    def fresh(self, base: str) -> str:
        return fresh_name(self.taken, base)


class _Rewrite:
    def __init__(self, model: onnx.ModelProto, index: GraphIndex, planned: set[int]):
        self.model, self.index, self.planned = model, index, planned
        self.names = _Names(model)
        self.initializers: list[onnx.TensorProto] = []
        self.replaced: dict[int, list[onnx.NodeProto]] = {}  # output producer -> new nodes
        self.removed: set[int] = set()
        self.candidates: set[int] = set()  # may be dead afterwards

    def constant(self, base: str, array: np.ndarray) -> str:
        name = self.names.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def source(self, tensor: str, order: list[int]) -> tuple[str, list[onnx.NodeProto]]:
        """`tensor` transposed by `order`, reusing the input of an inverse Transpose that produced it."""
        if order == sorted(order):
            return tensor, []
        i = self.index.producer.get(tensor)
        if i is not None and i not in self.removed and self.index.nodes[i].op_type == "Transpose":
            node = self.index.nodes[i]
            perm = attribute(node, "perm")
            if perm is not None and len(perm) == len(order) and all(perm[order[k]] == k for k in range(len(order))):
                self.candidates.add(i)
                return node.input[0], []
        out = self.names.fresh(f"{tensor}/normbridge_transposed")
        return out, [
            helper.make_node(
                "Transpose", [tensor], [out], name=self.names.fresh(f"{tensor}/normbridge_Transpose"), perm=order
            )
        ]

    def target(self, output: str, perm: list[int], base: str) -> tuple[str, list[onnx.NodeProto]]:
        """The tensor the native op writes, and the Transpose back to `output`'s layout
        (or an inverse consumer removed)."""
        if perm == sorted(perm):
            return output, []
        users = self.index.consumer_nodes(output)
        if (
            output not in self.index.graph_outputs
            and len(users) == 1
            and users[0] not in self.planned
            and self.index.nodes[users[0]].op_type == "Transpose"
        ):
            node = self.index.nodes[users[0]]
            back = attribute(node, "perm")
            if back is not None and len(back) == len(perm) and all(perm[back[k]] == k for k in range(len(perm))):
                self.removed.add(users[0])
                return node.output[0], []
        native = self.names.fresh(f"{base}/normbridge_native")
        return native, [
            helper.make_node(
                "Transpose", [native], [output], name=self.names.fresh(f"{base}/normbridge_Transpose"), perm=perm
            )
        ]

    def emit(self, match: Match, spec: NormSpec | None) -> None:
        rank, frame = match.rank, list(match.frame)
        native_dtype = _native_dtype(self.index, match)
        dtype = np.dtype(native_dtype)
        info = KIND_INFO[match.kind]
        if info.trailing:
            order = [a for a in frame if a not in match.axes] + list(match.axes)
        else:
            c = match.channel_axis
            order = [0, c] + [a for a in range(rank) if a not in (0, c)]
        base = match.name or match.output
        x, before = self.source(match.input, order)
        y, after = self.target(match.output, [order.index(a) for a in frame], base)
        # The native op runs in the dtype the decomposition computes in; Casts keep the site's input and output dtypes.
        in_dtype, out_dtype = self.index.dtype(match.input), self.index.dtype(match.output)
        if in_dtype is not None and in_dtype != native_dtype:
            widened = self.names.fresh(f"{base}/normbridge_cast_in")
            before = before + [
                helper.make_node(
                    "Cast",
                    [x],
                    [widened],
                    name=self.names.fresh(f"{base}/normbridge_Cast"),
                    to=_tensor_type(native_dtype),
                )
            ]
            x = widened
        if out_dtype is not None and out_dtype != native_dtype:
            narrowed = self.names.fresh(f"{base}/normbridge_cast_out")
            after = [
                helper.make_node(
                    "Cast",
                    [narrowed],
                    [y],
                    name=self.names.fresh(f"{base}/normbridge_Cast"),
                    to=_tensor_type(out_dtype),
                )
            ] + after
            y = narrowed
        shape = tuple(match.dims)
        ones, zeros = np.ones(shape, dtype), np.zeros(shape, dtype)
        stash = onnx.TensorProto.DOUBLE if native_dtype == "float64" else onnx.TensorProto.FLOAT
        eps = as_float32(match.eps)
        op = info.onnx_op
        if match.kind == "batch":  # a folded BatchNorm: its tensors and eps come from the source spec
            # A mixed-precision spec's state may be narrower than the folded constants' dtype: widening it is exact.
            tensors = {
                name: array.astype(dtype) for name, array in spec.tensors.items() if name != "num_batches_tracked"
            }
            inputs = [
                tensors["scale"] if spec.scale else ones,
                tensors["bias"] if spec.bias else zeros,
                tensors["running_mean"],
                tensors["running_var"],
            ]
            names = [self.constant(f"{base}.{field}", array) for field, array in zip(info.onnx_inputs, inputs)]
            attributes = {"epsilon": eps}
            momentum = spec.momentum_as("running_weight")
            if momentum is not None:
                attributes["momentum"] = as_float32(momentum)
        else:
            # Coefficients were read in the widest type they met and the op runs in the dtype they were applied in
            # (`_native_dtype`); the values are the graph's, so this cast is exact.
            names = [self.constant(f"{base}.scale", ones if match.scale is None else match.scale.astype(dtype))]
            # LayerNormalization may omit B, RMSNormalization has none; the channel ops need one.
            if not info.trailing or (info.bias and match.bias is not None):
                names.append(self.constant(f"{base}.bias", zeros if match.bias is None else match.bias.astype(dtype)))
            if info.trailing:
                attributes = {"axis": -len(match.axes), "epsilon": eps, "stash_type": stash}
            elif match.kind == "group":
                attributes = {"num_groups": match.groups, "epsilon": eps, "stash_type": stash}
            else:
                attributes = {"epsilon": eps}
        node = helper.make_node(op, [x] + names, [y], name=self.names.fresh(base), **attributes)
        output_producer = self.index.producer[match.output]
        self.replaced[output_producer] = before + [node] + after
        self.candidates.update(match.nodes)

    def finish(self) -> None:
        graph = self.model.graph
        nodes: list[onnx.NodeProto] = []
        origin: list[int | None] = []
        for i, node in enumerate(self.index.nodes):
            if i in self.replaced:
                nodes.extend(self.replaced[i])
                origin.extend([None] * len(self.replaced[i]))
            elif i not in self.removed:
                nodes.append(node)
                origin.append(i)
        candidates = self.candidates | {i for i, n in enumerate(self.index.nodes) if n.op_type == "Constant"}
        nodes, origin = _dead_code(graph, nodes, origin, candidates)
        nodes = _cancel_transposes(graph, nodes, {n.name for new in self.replaced.values() for n in new})
        used = {name for node in nodes for name in list(node.input) + sorted(subgraph_reads(node))}
        dropped = {
            name for i in set(self.candidates) | self.removed | set(self.replaced) for name in self.index.nodes[i].input
        }
        declared = {value.name for value in graph.input}  # IR < 4 lists initializers as inputs: keep those
        kept = [t for t in graph.initializer if t.name in used or t.name not in dropped or t.name in declared]
        del graph.node[:]
        graph.node.extend(nodes)
        del graph.initializer[:]
        graph.initializer.extend(kept + self.initializers)
        produced = {name for node in nodes for name in node.output}
        values = [v for v in graph.value_info if v.name in produced]
        del graph.value_info[:]
        graph.value_info.extend(values)


def _tensor_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _native_dtype(index: GraphIndex, match: Match) -> str:
    """The dtype the native op runs in: the site's input dtype, unless the site widens its input (a Cast it includes)
    and computes in the wider dtype up to its affine or its output.

    Keras's mixed-policy layers cast a float16 input to float32 and apply their float32 variables there, then cast back;
    LlamaRMSNorm casts back first and applies its bfloat16 weight in bfloat16, which the narrow op with stash_type=1
    computes. A folded BatchNorm (no Cast in the site) runs in its constants' dtype, `match.dtype`."""
    narrow = index.dtype(match.input)
    casts = [i for i in match.nodes if index.nodes[i].op_type == "Cast" and index.nodes[i].input[0] == match.input]
    wide = index.dtype(index.nodes[casts[0]].output[0]) if casts else None
    if match.kind == "batch" or wide is None or wide == narrow:
        return match.dtype
    affine = {
        index.dtype(index.nodes[i].output[0])
        for i in match.nodes
        if index.nodes[i].op_type in ("Mul", "Add", "Sub")
        and any(_coefficient(index, name) for name in index.nodes[i].input)
    }
    if wide in affine or (not affine and index.dtype(match.output) == wide):
        return wide
    return narrow


def _coefficient(index: GraphIndex, name: str) -> bool:
    """A per-feature float constant (a scale or bias), not a scalar such as eps."""
    array = index.constant(name)
    return array is not None and array.size > 1 and is_float_dtype(array.dtype)


def _dead_code(graph: onnx.GraphProto, nodes: list, origin: list, candidates: set[int]):
    """Drop candidate nodes whose outputs nothing reads (repeatedly); other nodes are never touched."""
    outputs = {o.name for o in graph.output}
    changed = True
    while changed:
        changed = False
        used = {name for node in nodes for name in list(node.input) + sorted(subgraph_reads(node))} | outputs
        keep = [
            k
            for k, (node, i) in enumerate(zip(nodes, origin))
            if i not in candidates or any(o in used for o in node.output if o)
        ]
        if len(keep) != len(nodes):
            nodes, origin = [nodes[k] for k in keep], [origin[k] for k in keep]
            changed = True
    return nodes, origin


def _cancel_transposes(graph: onnx.GraphProto, nodes: list, created: set[str]) -> list:
    """Remove Transpose pairs that undo each other where the rewrite created one of them (two adjacent sites)."""
    outputs = {o.name for o in graph.output}
    while True:
        producer = {name: k for k, node in enumerate(nodes) for name in node.output}
        users: dict[str, int] = {}
        captured = {name for node in nodes for name in subgraph_reads(node)}
        for node in nodes:
            for name in list(node.input) + sorted(subgraph_reads(node)):
                users[name] = users.get(name, 0) + 1
        pair = None
        for k, node in enumerate(nodes):
            if node.op_type != "Transpose" or node.input[0] not in producer:
                continue
            first = nodes[producer[node.input[0]]]
            if first.op_type != "Transpose" or not ({first.name, node.name} & created):
                continue
            p, q = attribute(first, "perm"), attribute(node, "perm")
            if p is None or q is None or len(p) != len(q) or any(p[q[i]] != i for i in range(len(q))):
                continue
            if (
                users.get(node.input[0], 0) == 1
                and node.input[0] not in outputs
                and node.output[0] not in outputs | captured
            ):
                pair = (producer[node.input[0]], k, first.input[0], node.output[0])
                break
        if pair is None:
            return nodes
        first_index, second_index, source, replaced = pair
        nodes = [node for k, node in enumerate(nodes) if k not in (first_index, second_index)]
        for node in nodes:
            if replaced in node.input:
                node.input[:] = [source if name == replaced else name for name in node.input]


def _apply(model: onnx.ModelProto, index: GraphIndex, plans: list[tuple[Match, NormSpec | None]]) -> None:
    rewrite = _Rewrite(model, index, {i for match, _ in plans for i in match.nodes})
    for match, spec in plans:
        rewrite.emit(match, spec)
    rewrite.finish()
