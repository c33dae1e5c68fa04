"""Building the one-layer ModelProto every `from_spec` returns.

The graph has one input "X" (symbolic batch and spatial dims, fixed feature dims) of the
rank `input_dims` gives, one output "Y" of the same shape, the layer's state as named initializers and the
spec in the metadata. It is checked with `full_check=True` before it leaves here, so
a conversion never hands out a model that onnxruntime would reject on load.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from schemas import LayerReport, NormSpec, NotExpressibleError
from schemas.kinds import KIND_INFO

from ..options import ConversionOptions
from ..translate import record_eps, record_layout, tensor_fate
from . import metadata

INPUT, OUTPUT = "X", "Y"
#: Spec dtype -> its name in ONNX type strings ("tensor(double)").
ONNX_TYPE_NAMES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float", "float64": "double"}
#: Float types a stash_type may name (TensorProto enum values).
FLOAT, DOUBLE = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE


def element_type(dtype: str) -> int:
    """TensorProto element type of a spec dtype."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def stash_type(dtype: str) -> int:
    """float32 statistics for float16/float32 (what the frameworks compute); float64 stays float64."""
    return DOUBLE if dtype == "float64" else FLOAT


#: The smallest input rank each kind's op takes (InstanceNormalization needs a spatial axis).
MIN_RANK = {"batch": 2, "instance": 3, "group": 2}


def input_dims(spec: NormSpec) -> list[int | str]:
    """Shape of X: N and spatial dims symbolic, channels or normalized dims fixed.

    The ops take any rank, but the ONNX IR requires every input of a main graph to have a shape,
    so the rank is fixed (onnx.checker rejects an unranked X; onnxruntime then refuses other
    ranks). It is spec.input_rank (what the source recorded, or `input_rank=` of the conversion);
    without it, 2 + spatial_rank for BatchNorm and InstanceNorm, (N, C, H, W) for GroupNorm and
    (N, T, *normalized_shape) for LayerNorm and RMSNorm, the shapes converters.probe uses.
    `record_rank` says which in the report.
    """
    if KIND_INFO[spec.kind].trailing and spec.layout == "channels_first":
        # over the channel axis (a Keras LayerNormalization(axis=1), ConvNeXt's LayerNorm2d): (N, C, D1, ...),
        # as the probe
        rank = spec.input_rank or 4
        return ["N", *spec.normalized_shape] + [f"D{i}" for i in range(1, rank - 1)]
    if KIND_INFO[spec.kind].trailing:
        rank = spec.input_rank or len(spec.normalized_shape) + 2
        leading = rank - len(spec.normalized_shape)
        return (["N"] if leading else []) + [f"D{i}" for i in range(1, leading)] + list(spec.normalized_shape)
    rank = spec.input_rank or 2 + (spec.spatial_rank or 2)
    return ["N", spec.num_features] + [f"D{i}" for i in range(1, rank - 1)]


def record_rank(report: LayerReport, spec: NormSpec, dims: list[int | str]) -> None:
    """Say in the report which rank X has and why it is fixed."""
    minimum = len(spec.normalized_shape) if KIND_INFO[spec.kind].trailing else MIN_RANK[spec.kind]
    if spec.kind == "instance" and len(dims) < MIN_RANK["instance"]:
        raise NotExpressibleError(
            f"InstanceNormalization needs an input of rank >= 3 (N, C, D1, ...), got input_rank {len(dims)}; an unbatched (C, L) input "
            "needs a batch axis of 1 first.",
            layer=spec.name,
            setting="input_rank",
            target="onnx",
        )
    why = f"the ONNX IR requires a main-graph input to have a shape, so X is fixed to rank {len(dims)} (the op itself takes any rank >= {minimum}); "
    if spec.input_rank is None:
        report.add(
            "input_rank",
            None,
            len(dims),
            "translated",
            why + "the source records no rank, so this is the kind's usual rank: pass input_rank= to choose another",
        )
    else:
        report.add("input_rank", spec.input_rank, note=why.rstrip("; "))


@functools.lru_cache(
    maxsize=256
)  # onnx's schemas are fixed for the process; get_schema copies one out per call (~10 us)
def op_version(op: str, opset: int) -> int:
    """The version of `op` an opset selects (BatchNormalization at opset 13 is BatchNormalization-9)."""
    return onnx.defs.get_schema(op, opset).since_version


@functools.lru_cache(maxsize=256)
def first_input_types(op: str, opset: int) -> tuple[int, tuple[str, ...] | None]:
    """(the op's version at `opset`, the types its first input takes; None where no type constraint names that
    input)."""
    schema = onnx.defs.get_schema(op, opset)
    first = schema.inputs[0].type_str if schema.inputs else ""
    allowed = next((tuple(c.allowed_type_strs) for c in schema.type_constraints if c.type_param_str == first), None)
    return schema.since_version, allowed


class LayerGraph:
    """Collects the nodes and initializers of one layer's graph; `finish` makes the checked model."""

    def __init__(self, spec: NormSpec, options: ConversionOptions, report: LayerReport, *, eps_float32: bool = True):
        if options.opset > onnx.defs.onnx_opset_version():
            raise NotExpressibleError(
                f"opset {options.opset} is newer than this onnx {onnx.__version__} knows (up to {onnx.defs.onnx_opset_version()}); pass a lower opset.",
                layer=spec.name,
                setting="opset",
                target="onnx",
            )
        self.spec, self.opset, self.report = spec, options.opset, report
        self.dims = input_dims(spec)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.emitted: list[str] = []  # spec tensors carried bit-identically
        if not KIND_INFO[
            spec.kind
        ].trailing:  # a trailing kind's layout is the axis it normalises: its adapter says how (layer.py)
            record_layout(report, spec, "channels_first")
        if spec.chosen_layout is not None:
            report.add(
                "chosen_layout",
                spec.chosen_layout,
                spec.chosen_layout,
                "stored",
                f"in metadata '{metadata.KEY}', for a conversion back to a framework that offers both layouts",
            )
        self.eps = record_eps(report, spec, float32_attribute=eps_float32)
        record_rank(report, spec, self.dims)
        if spec.compute_dtype is not None:
            if spec.compute_dtype != "float32" or spec.dtype not in ("bfloat16", "float16"):
                raise NotExpressibleError(
                    f"ONNX computes a {spec.dtype} layer's statistics in float32 (stash_type=1) or in its own type, not in "
                    f"compute_dtype={spec.compute_dtype!r}; keep the layer in its source framework.",
                    layer=spec.name,
                    setting="compute_dtype",
                    target="onnx",
                )
            report.add("compute_dtype", spec.compute_dtype, "stash_type=1", "translated", "statistics in float32")

    @property
    def rank(self) -> int:
        return len(self.dims)

    def tensor(self, suffix: str, array: np.ndarray) -> str:
        """Add an initializer named '<layer name>.<suffix>' (deterministic, so decompositions can be read back)."""
        name = f"{self.spec.name}.{suffix}"
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C"), name))
        return name

    def state(self, name: str, shape: tuple[int, ...] | None = None) -> str:
        """Add the spec's tensor `name` bit-identically (optionally reshaped for broadcasting)."""
        self.emitted.append(name)
        array = self.spec.tensors[name]
        return self.tensor(name, array if shape is None else array.reshape(shape))

    def affine(self, required: tuple[str, ...] = ("scale", "bias")) -> tuple[str, str]:
        """Initializer names of scale and bias; "" for an absent one the op lets us omit.

        An absent tensor the op `required`s becomes ones/zeros, reported "stored": the
        metadata remembers that the source had none.
        """
        names = []
        for field, identity in (("scale", np.ones), ("bias", np.zeros)):
            if getattr(self.spec, field):
                names.append(self.state(field))
            elif field in required:
                shape = self.spec.normalized_shape or (self.spec.num_features,)
                names.append(self.tensor(field, identity(shape, dtype=self.spec.dtype)))
                self.report.add(
                    field,
                    False,
                    f"{identity.__name__}{list(shape)}",
                    "stored",
                    f"the op needs a {field} tensor; 'no {field}' is kept in metadata '{metadata.KEY}'",
                )
            else:
                names.append("")
        return names[0], names[1]

    def node(self, op: str, inputs: list[str], outputs: list[str] | None = None, **attributes) -> str:
        """Append a node named '<layer>/<op>_<index>' and return its first output (by default the node's name)."""
        name = f"{self.spec.name}/{op}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, outputs or [name], name=name, **attributes))
        return self.nodes[-1].output[0]

    def instance_norm(self, x: str, scale: str, bias: str) -> str:
        """An InstanceNormalization node, warning where onnxruntime cannot run it."""
        if self.spec.dtype == "float64":
            self.report.warn(
                "onnxruntime's CPU provider does not implement InstanceNormalization for float64: the model is valid ONNX but onnxruntime CPU cannot run it."
            )
        return self.node("InstanceNormalization", [x, scale, bias], epsilon=self.eps)

    def output(self, name: str, dims: list[int | str]) -> None:
        """Declare an extra graph output (running statistics of a training-mode BatchNormalization)."""
        self.outputs.append(helper.make_tensor_value_info(name, element_type(self.spec.dtype), dims))

    def finish(self, result: str, target_op: str, *, native: bool) -> onnx.ModelProto:
        """Rename `result` to "Y", record the op and tensor fates, attach metadata, check and return the model."""
        for node in self.nodes:
            node.output[:] = [OUTPUT if name == result else name for name in node.output]
        if native:
            self.nodes[0].name = self.spec.name  # the layer's name survives a graph without metadata
        self.report.target_op, self.report.native = target_op, native
        tensor_fate(self.report, self.spec, names=tuple(self.emitted))
        if "num_batches_tracked" in self.spec.tensors:
            count = int(self.spec.tensors["num_batches_tracked"])
            self.report.add("num_batches_tracked", count, count, "stored", f"kept in metadata '{metadata.KEY}'")
        self._check_dtype_allowed()
        value_type = element_type(self.spec.dtype)
        graph = helper.make_graph(
            self.nodes,
            self.spec.name,
            [helper.make_tensor_value_info(INPUT, value_type, self.dims)],
            [helper.make_tensor_value_info(OUTPUT, value_type, self.dims)] + self.outputs,
            initializer=self.initializers,
        )
        opsets = [helper.make_opsetid("", self.opset)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="normbridge")
        model.ir_version = helper.find_min_ir_version_for(opsets)
        metadata.attach(model, self.spec)
        onnx.checker.check_model(model, full_check=True)
        return model

    def _check_dtype_allowed(self) -> None:
        """NotExpressibleError naming the op when one of the graph's ops takes no input of the spec's dtype at this
        opset.

        BatchNormalization takes bfloat16 from version 14, InstanceNormalization from 22
        (so GroupNorm's decomposition too).
        """
        wanted = f"tensor({ONNX_TYPE_NAMES[self.spec.dtype]})"
        for node in self.nodes:
            since_version, allowed = first_input_types(node.op_type, self.opset)
            if allowed is not None and wanted not in allowed:
                raise NotExpressibleError(
                    f"{node.op_type}-{since_version} (opset {self.opset}) takes no {self.spec.dtype} input; pass a higher opset "
                    "(opset 22 and later hold every kind in bfloat16) or convert a float32 spec.",
                    layer=self.spec.name,
                    setting="dtype",
                    target="onnx",
                )

    def finish_native(self, op: str, inputs: list[str], **attributes) -> onnx.ModelProto:
        """The graph of one native node X -> Y."""
        while inputs and not inputs[-1]:
            inputs = inputs[:-1]  # optional trailing inputs (LayerNormalization's B) are omitted
        self.node(op, [INPUT] + inputs, [OUTPUT], **attributes)
        return self.finish(OUTPUT, f"{op}-{op_version(op, self.opset)}", native=True)
