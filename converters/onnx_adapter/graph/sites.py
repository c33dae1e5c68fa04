"""Every normalization in an ONNX graph, native or decomposed, as a `NormSite`.

Serving graphs rarely hold the native ops alone: torch.onnx writes RMSNorm below opset 23 and
GroupNorm below opset 21 as primitive ops, tf2onnx (Keras `model.export(format="onnx")`)
writes LayerNormalization, RMSNormalization and GroupNormalization as moments arithmetic and
folds BatchNormalization into a Mul and an Add, and torch.onnx folds an eval BatchNorm into the
preceding Conv. `find_norm_sites` reports each of them as the layer it is, with its eps read
back exactly; the matchers themselves live in `patterns`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from schemas import NormbridgeError, NormSpec, Source, SpecError, UnsupportedObjectError

from .patterns import Match, find_matches
from .index import GraphIndex


@dataclass(frozen=True)
class NormSite:
    """One normalization layer in a graph: a native node, or the nodes of its decomposition.

    `node_names` lists the nodes in graph order (an unnamed node by its first output).

    `eps` is the shortest decimal of the stored float32 (None for a BatchNorm folded into
    constants, where it is gone); `spec` is set when every state tensor is a constant, else
    `problem` says why it could not be read (a SpecError naming the setting, when there is one).
    """

    name: str
    kind: str
    native: bool
    origin: str
    node_names: tuple[str, ...]
    op_types: tuple[str, ...]
    input: str
    output: str
    eps: float | None
    training_mode: bool
    spec: NormSpec | None
    folded: bool = False
    problem: NormbridgeError | None = field(default=None, compare=False, repr=False)


def require_model(model) -> onnx.ModelProto:
    """`model` if it is an onnx.ModelProto, else UnsupportedObjectError."""
    if not isinstance(model, onnx.ModelProto):
        raise UnsupportedObjectError(
            f"got a {type(model).__module__}.{type(model).__qualname__}, expected an onnx.ModelProto; load files with load_onnx()."
        )
    return model


def find_norm_sites(model: onnx.ModelProto) -> list[NormSite]:
    """Every normalization of `model`'s main graph in graph order (subgraphs of If/Loop are not searched)."""
    index = GraphIndex(require_model(model))
    matches = find_matches(index)
    single = _single_layer_spec(model) if len(matches) == 1 else None
    return [site_of(index, match, single) for match in matches]


def batchnorm_folded_into_conv(model: onnx.ModelProto) -> bool:
    """True when the graph has Conv nodes but no BatchNormalization and no folded BatchNorm site.

    That is what an exporter leaves after folding each BatchNorm into its Conv's weights
    (torch.onnx does in eval). The graph alone cannot tell a folded network from one that never
    had a BatchNorm: read it together with the source model's layers.
    """
    index = GraphIndex(require_model(model))
    ops = {node.op_type for node in index.nodes}
    if "Conv" not in ops or "BatchNormalization" in ops:
        return False
    return not any(match.kind == "batch" and match.folded for match in find_matches(index))


# -- building sites ---------------------------------------------------------------------------


def site_of(index: GraphIndex, match: Match, single: NormSpec | None = None, spec: NormSpec | None = None) -> NormSite:
    """The public NormSite of a match (its spec read or built unless `spec` is given)."""
    nodes = sorted(match.nodes)
    problem = None
    if spec is None and match.folded:
        problem = SpecError(
            "the BatchNormalization was folded into Mul/Add constants, so its eps and running statistics are gone and "
            "it cannot be checked; register the source model, or export it without folding (torch.onnx optimize=False)."
        )
    elif spec is None:
        spec, problem = (single, None) if single is not None else read_spec_of_match(index, match)
    return NormSite(
        name=match.name,
        kind=match.kind,
        native=match.native,
        origin=match.origin,
        node_names=tuple(index.nodes[i].name or index.nodes[i].output[0] for i in nodes),
        op_types=tuple(index.nodes[i].op_type for i in nodes),
        input=match.input,
        output=match.output,
        eps=match.eps if spec is None else spec.eps,
        training_mode=match.training_mode,
        spec=spec,
        folded=match.folded,
        problem=problem,
    )


def _single_layer_spec(model: onnx.ModelProto) -> NormSpec | None:
    """The full spec (metadata included) when the model is a one-layer model normbridge can read."""
    from .. import metadata, reading

    if len(model.graph.node) != 1 and not any(prop.key == metadata.KEY for prop in model.metadata_props):
        return None  # not a one-layer model: skip parse(), which would read every weight first
    try:
        reading.parse(model)
    except NormbridgeError:
        return None
    from ...api import to_spec

    try:
        return to_spec(model)
    except NormbridgeError:
        return None


def spec_of_match(index: GraphIndex, match: Match) -> NormSpec | None:
    """The layer's spec: read from a native node, or built from a decomposition's constants; None if not exact."""
    return read_spec_of_match(index, match)[0]


def read_spec_of_match(index: GraphIndex, match: Match) -> tuple[NormSpec | None, NormbridgeError | None]:
    """(the layer's spec, None), or (None, why it cannot be read: NaN statistics, constants that are not exact, ...)."""
    try:
        if match.native:
            return _native_spec(index, match), None
        return _decomposition_spec(index, match), None
    except NormbridgeError as error:
        return None, error
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        return None, SpecError(f"its state does not form a valid spec ({str(error).splitlines()[-1].strip()})")


def _native_spec(index: GraphIndex, match: Match) -> NormSpec:
    from ..node_reading import node_layer, read_node

    node = index.nodes[match.nodes[0]]
    dims = index.dims(node.input[0])
    shape = None if dims is None else tuple(d if isinstance(d, int) else None for d in dims)
    layer = node_layer(
        index.model, node, constants=index.constants, shape=shape, elem_type=index.elem_type(node.input[0])
    )
    return read_node(layer)


def _decomposition_spec(index: GraphIndex, match: Match) -> NormSpec:
    if match.affine_inputs:
        raise SpecError(
            f"its scale or bias ({', '.join(repr(n) for n in match.affine_inputs)}) is not a constant (a graph input, or computed), "
            "so its values are unknown; store the weights as initializers.",
            setting="scale",
        )
    if match.dtype is None or match.dims is None or match.eps is None or match.eps <= 0:
        raise SpecError(
            f"its decomposition ({match.origin}) has no constant dtype, shape and positive eps, so its settings cannot be read exactly."
        )
    dtype = np.dtype(match.dtype)
    tensors = {}
    for name, array in (("scale", match.scale), ("bias", match.bias)):
        if array is not None:
            tensors[name] = np.ascontiguousarray(array.astype(dtype, copy=False))
    fields = dict(
        name=match.name or match.output,
        kind=match.kind,
        eps=match.eps,
        dtype=match.dtype,
        input_rank=match.rank,
        scale="scale" in tensors,
        bias="bias" in tensors,
        source=Source(
            framework="onnx", framework_version=onnx.__version__, layer_type=f"decomposition({match.origin})"
        ),
    )
    if match.kind in ("layer", "rms"):
        fields.update(normalized_shape=tuple(int(d) for d in match.dims))
    else:
        last = None if match.rank is None else match.rank - 1
        layout = (
            "channels_first" if match.channel_axis == 1 else "channels_last" if match.channel_axis == last else None
        )
        if layout is None:
            raise SpecError(
                f"its decomposition ({match.origin}) normalizes channel axis {match.channel_axis}, neither the first nor the last."
            )
        fields.update(num_features=int(match.dims[0]), layout=layout)
        if match.kind == "group":
            fields.update(num_groups=match.groups)
        else:
            fields.update(spatial_rank=max(min(match.rank - 2, 3), 1))
    return NormSpec(**fields, tensors=tensors)
