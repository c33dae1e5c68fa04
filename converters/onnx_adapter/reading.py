"""Finding the one normalization layer in a ModelProto: its node, attributes, state and metadata.

A model normbridge reads holds either one native node (BatchNormalization,
InstanceNormalization, LayerNormalization, GroupNormalization, RMSNormalization) or a
decomposition normbridge itself emitted, recognised by its metadata. Anything else is
refused with a list of what was found, because guessing which node is "the layer" in
an arbitrary graph would silently convert the wrong thing.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper
from pydantic import ValidationError

from schemas import LayerReport, NormSpec, Source, SpecError, UnsupportedObjectError
from schemas.kinds import KIND_INFO

from .. import recognizers
from ..options import MIN_OPSET
from . import metadata
from .layer_graph import op_version
from .proto import DEFAULT_DOMAINS, FLOAT_TYPES

#: The native ops, as named in messages.
NATIVE_OPS = tuple(info.onnx_op for info in KIND_INFO.values() if info.onnx_op is not None)
#: Ops of the decompositions normbridge emits below the native opsets.
DECOMPOSITION_OPS = frozenset(
    {
        "ReduceMean",
        "Sub",
        "Mul",
        "Add",
        "Sqrt",
        "Div",
        "Cast",
        "Reshape",
        "Shape",
        "InstanceNormalization",
        "Transpose",
        "LayerNormalization",
    }
)  # the last two: a channels-first layer norm (layer.py)
#: Kinds whose native op is newer than the oldest opset normbridge writes: below it they are decomposed.
DECOMPOSED_KINDS = tuple(
    kind for kind, info in KIND_INFO.items() if info.onnx_opset is not None and info.onnx_opset > MIN_OPSET
)


def default_eps(layer: "OnnxLayer") -> float:
    """The epsilon the layer's op uses when the attribute is absent."""
    return KIND_INFO[recognizers.kind_of("onnx", layer.node)].default_eps["onnx"]


@dataclass(frozen=True)
class OnnxLayer:
    """One normalization layer found in a model; `node` is None for a decomposition."""

    model: onnx.ModelProto
    kind: str
    opset: int
    node: onnx.NodeProto | None
    input_name: str
    dtype: str
    shape: tuple[int | None, ...] | None  # None: X is unranked (what normbridge writes)
    raw_metadata: dict | None
    initializers: dict[str, np.ndarray] = field(repr=False)
    graph_inputs: frozenset[str] = frozenset()

    @property
    def rank(self) -> int | None:
        """X's rank; None when X is unranked."""
        return None if self.shape is None else len(self.shape)

    def known_rank(self, report: LayerReport, meta: dict) -> int | None:
        """X's rank, or the rank the metadata records for an unranked X."""
        if self.rank is not None:
            return self.rank
        rank = meta.get("input_rank")
        return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1 else None

    def spatial_rank(self, report: LayerReport, meta: dict) -> int:
        """1, 2 or 3 (BatchNorm/InstanceNorm 1d/2d/3d): from X's rank, else from the metadata;
        SpecError when neither tells."""
        if self.rank is not None:
            return max(self.rank - 2, 1)
        spatial = meta.get("spatial_rank")
        if isinstance(spatial, int) and not isinstance(spatial, bool) and 1 <= spatial <= 3:
            return spatial
        raise SpecError(
            f"input '{self.input_name}' of {self.layer_type} is unranked and no '{metadata.KEY}' metadata records the spatial rank, "
            "so a 1d, 2d or 3d layer cannot be told apart; give X a shape (at least its rank) in the graph.",
            layer=self.name,
            setting="spatial_rank",
        )

    @property
    def version(self) -> int:
        """The op version the model's opset selects for the native node."""
        return op_version(self.node.op_type, self.opset)

    @property
    def layer_type(self) -> str:
        return "decomposition" if self.node is None else f"{self.node.op_type}-{self.version}"

    @property
    def name(self) -> str:
        """The layer name: the metadata's (ONNX has no layer names), else the node's, else the graph's."""
        named = (self.raw_metadata or {}).get("name")
        if isinstance(named, str) and named:
            return named
        return (self.node.name if self.node is not None else "") or self.model.graph.name or "norm"

    def source(self) -> Source:
        return Source(framework="onnx", framework_version=onnx.__version__, layer_type=self.layer_type)

    def metadata(self, report: LayerReport) -> dict:
        """The normbridge metadata when it is readable and describes this kind; {} otherwise (with a warning)."""
        if self.raw_metadata is None:
            report.warn(f"metadata '{metadata.KEY}' is not a JSON object; ignored it and read the graph alone.")
            return {}
        if self.raw_metadata and self.raw_metadata.get("kind") != self.kind:
            report.warn(
                f"metadata '{metadata.KEY}' describes a {self.raw_metadata.get('kind')!r} layer but the graph holds a {self.kind} layer; ignored it."
            )
            return {}
        return self.raw_metadata

    def attribute(self, name: str, default=None):
        """The node's attribute `name`, or the op's default."""
        for attribute in self.node.attribute:
            if attribute.name == name:
                return helper.get_attribute_value(attribute)
        return default

    def tensor(self, index: int, setting: str) -> np.ndarray | None:
        """The initializer feeding input `index` of the node; None for an omitted optional input."""
        name = self.node.input[index] if index < len(self.node.input) else ""
        if not name:
            return None
        if name in self.initializers:
            return self.initializers[name]
        where = "a graph input" if name in self.graph_inputs else "computed by another node"
        raise SpecError(
            f"the {setting} tensor '{name}' of {self.node.op_type} is {where}, not an initializer, so its value is unknown; "
            "store it as an initializer (for example with onnx's constant folding) and read the model again.",
            layer=self.name,
            setting=setting,
        )

    def channels(self, per_channel: np.ndarray) -> int:
        """C from a per-channel tensor, checked against X's channel dim when that is known."""
        count = int(per_channel.shape[0]) if per_channel.ndim == 1 else -1
        if count < 1 or (self.rank is not None and self.rank > 1 and self.shape[1] not in (None, count)):
            raise SpecError(
                f"{self.layer_type} has a per-channel tensor of shape {list(per_channel.shape)} but input X has shape {list(self.shape)}; "
                "expected shape [C] with C = X's dim 1.",
                layer=self.name,
                setting="num_features",
            )
        return count


#: id(model) -> (model, its layer) while a caller holds its models unchanged (`models_unchanged`); None otherwise.
_PARSED: contextvars.ContextVar[dict[int, tuple[onnx.ModelProto, OnnxLayer]] | None] = contextvars.ContextVar(
    "parsed", default=None
)


@contextlib.contextmanager
def models_unchanged() -> Iterator[None]:
    """A block in which the caller changes none of the models it passes `parse`: each model object is parsed once there.

    Why: check_many reads, then runs, every ONNX model it writes; each of those asks `parse` (the kind, the spec, the
    eval run, the training run), and a parse reads every initializer. The layer found is the one a parse of the
    unchanged model finds; its tensors are made read-only, so no reader can change what the next one reads."""
    token = _PARSED.set({})
    try:
        yield
    finally:
        _PARSED.reset(token)


def parse(model, kind: str | None = None) -> OnnxLayer:
    """The layer held by `model`; UnsupportedObjectError when it holds anything else (or not kind `kind`)."""
    parsed = _PARSED.get()
    if parsed is None:
        return _parse(model, kind)
    held = parsed.get(id(model))
    if held is not None and held[0] is model:  # parsed whole once: only the kind is left to check, as _parse checks it
        _refuse_other_kind(held[1].kind, kind)
        return held[1]
    layer = _parse(model, kind)
    for array in layer.initializers.values():
        array.setflags(write=False)
    parsed[id(model)] = (model, layer)
    return layer


def _refuse_other_kind(found: str, kind: str | None) -> None:
    if kind is not None and found != kind:
        raise UnsupportedObjectError(
            f"the ONNX model holds a {found} layer, expected a {kind} layer; use the {found} adapter (converters.to_spec picks it)."
        )


def _parse(model, kind: str | None) -> OnnxLayer:
    if not isinstance(model, onnx.ModelProto):
        raise UnsupportedObjectError(
            f"got a {type(model).__module__}.{type(model).__qualname__}, expected an onnx.ModelProto; load files with load_onnx()."
        )
    graph = model.graph
    opsets = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not opsets:
        raise UnsupportedObjectError(
            "the ONNX model imports no default-domain opset, expected one (e.g. opset 23); re-export it with an opset_import."
        )
    initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    inputs = {value.name: value for value in graph.input}
    data_inputs = [name for name in inputs if name not in initializers]
    raw = metadata.load(model)
    ops = [n.op_type for n in graph.node]
    # onnx_adapter/recognizers/ops.py tells a native normalization node.
    found = recognizers.kind_of("onnx", graph.node[0]) if len(graph.node) == 1 else None
    node = graph.node[0] if found is not None else None
    if node is not None:
        try:
            op_version(ops[0], max(opsets))
        except onnx.defs.SchemaError:
            raise UnsupportedObjectError(
                f"{ops[0]} does not exist at opset {max(opsets)}, expected an op the model's opset defines; fix the model's opset_import."
            ) from None
        x = node.input[0]
        if found == "batch" and raw and raw.get("kind") == "instance" and _training_mode(node) == 0:
            found = "instance"  # a tracked InstanceNorm emitted as an eval-mode BatchNormalization
    elif (
        raw and raw.get("kind") in DECOMPOSED_KINDS and ops and set(ops) <= DECOMPOSITION_OPS and len(data_inputs) == 1
    ):
        found, x = raw["kind"], data_inputs[0]
    else:
        raise UnsupportedObjectError(
            f"the ONNX graph holds {len(ops)} nodes ({', '.join(ops) or 'none'}), expected one normalization node "
            f"({', '.join(NATIVE_OPS)}) or a decomposition normbridge emitted (with its '{metadata.KEY}' metadata); "
            "extract the layer into a model of its own."
        )
    _refuse_other_kind(found, kind)
    if x not in inputs or x in initializers:
        raise UnsupportedObjectError(
            f"the normalization's data input '{x}' is not a graph input, expected the model's input X to feed it directly."
        )
    tensor_type = inputs[x].type.tensor_type
    if tensor_type.elem_type not in FLOAT_TYPES:
        name = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
        raise UnsupportedObjectError(
            f"input '{x}' has element type {name}, expected BFLOAT16, FLOAT16, FLOAT or DOUBLE."
        )
    # An unranked X (what normbridge writes) is fine: the readers take the rank from the metadata where they need it.
    shape = (
        tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim)
        if tensor_type.HasField("shape")
        else None
    )
    return OnnxLayer(
        model,
        found,
        max(opsets),
        node,
        x,
        FLOAT_TYPES[tensor_type.elem_type],
        shape,
        raw,
        initializers,
        frozenset(inputs),
    )


def _training_mode(node: onnx.NodeProto) -> int:
    for attribute in node.attribute:
        if attribute.name == "training_mode":
            return helper.get_attribute_value(attribute)
    return 0


def common_fields(layer: OnnxLayer, report: LayerReport, meta: dict) -> dict:
    """Spec fields every kind reads the same way: name, dtype, input rank, mode, provenance."""
    return {
        "name": layer.name,
        "dtype": layer.dtype,
        "input_rank": metadata.trusted(
            report, meta, "input_rank", layer.rank, layer.rank is None or meta.get("input_rank") in (None, layer.rank)
        ),
        "training": bool(meta.get("training", False)),  # ONNX has no mode outside BatchNormalization
        "compute_dtype": compute_dtype(layer, report, meta),
        "source": layer.source(),
        # The layout chosen where the layer came from (a Keras axis=1 layer), kept for the way back:
        # ONNX is channels-first.
        "chosen_layout": meta.get("chosen_layout")
        if meta.get("chosen_layout") in ("channels_first", "channels_last")
        else None,
    }


def compute_dtype(layer: OnnxLayer, report: LayerReport, meta: dict) -> str | None:
    """float32 statistics of a bf16/fp16 layer, as the metadata says, while the node computes them so
    (stash_type FLOAT, the default).

    Ops without stash_type (BatchNormalization, InstanceNormalization) never hold one:
    their adapters refuse it on write.
    """
    wanted = meta.get("compute_dtype")
    if wanted is None:
        return None
    stash = layer.attribute("stash_type", onnx.TensorProto.FLOAT) if layer.node is not None else onnx.TensorProto.FLOAT
    has_stash = layer.node is None or "stash_type" in onnx.defs.get_schema(layer.node.op_type, layer.opset).attributes
    consistent = (
        wanted == "float32" and layer.dtype in ("bfloat16", "float16") and stash == onnx.TensorProto.FLOAT and has_stash
    )
    return metadata.trusted(report, meta, "compute_dtype", None, consistent)


def build(fields: dict, tensors: dict) -> NormSpec:
    """The validated spec (drops absent tensors); a metadata value of the wrong type is a SpecError."""
    try:
        return NormSpec(**fields, tensors={name: array for name, array in tensors.items() if array is not None})
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or "spec"
        raise SpecError(
            f"the graph and its '{metadata.KEY}' metadata give an invalid {where} ({problem['msg']}); remove the metadata to read the graph alone.",
            layer=fields.get("name"),
            setting=where,
        ) from error


def read_trailing(layer: OnnxLayer, report: LayerReport, *, has_bias: bool) -> NormSpec:
    """A layer/rms spec from LayerNormalization or RMSNormalization (axis, stash_type and scale checked)."""
    meta = layer.metadata(report)
    fields = common_fields(layer, report, meta)
    name, op = fields["name"], layer.node.op_type
    scale = layer.tensor(1, "scale")
    bias = layer.tensor(2, "bias") if has_bias else None
    axis = layer.attribute("axis", -1)
    rank = layer.known_rank(report, meta)
    if axis >= 0 and rank is None:
        raise SpecError(
            f"{op} axis={axis} counts from the front of X, which is unranked, and no '{metadata.KEY}' metadata records its rank; "
            "give X a shape (at least its rank) or use a negative axis.",
            layer=name,
            setting="normalized_shape",
        )
    # axis=0 normalises every axis (torch's LayerNorm over an unbatched input's whole shape): count == rank.
    count = -axis if axis < 0 else rank - axis
    trailing = layer.shape[layer.rank - count :] if layer.shape is not None and 0 < count <= layer.rank else ()
    if scale.ndim != count or any(d not in (None, s) for d, s in zip(trailing, scale.shape)):
        raise SpecError(
            f"{op} axis={axis} normalises the last {count} axes of X {list(layer.shape or ['unranked'])} but its scale has shape {list(scale.shape)}; "
            "expected a scale of exactly the normalised shape (broadcast scales are not supported).",
            layer=name,
            setting="normalized_shape",
        )
    stash = layer.attribute("stash_type", onnx.TensorProto.FLOAT)
    if stash not in (onnx.TensorProto.FLOAT, helper.np_dtype_to_tensor_dtype(np.dtype(layer.dtype))):
        raise SpecError(
            f"{op} has stash_type {onnx.TensorProto.DataType.Name(stash)}, expected FLOAT or the input's own type; "
            "statistics in another precision have no spec equivalent.",
            layer=name,
            setting="stash_type",
        )
    eps, eps_origin = metadata.eps(report, meta, layer.attribute("epsilon", default_eps(layer)))
    fields.update(
        kind=layer.kind,
        normalized_shape=tuple(int(d) for d in scale.shape),
        eps=eps,
        eps_origin=eps_origin,
        scale=metadata.affine_flag(report, meta, "scale", scale, 1.0),
        bias=bias is not None and metadata.affine_flag(report, meta, "bias", bias, 0.0),
    )
    return build(fields, {"scale": scale if fields["scale"] else None, "bias": bias if fields["bias"] else None})
