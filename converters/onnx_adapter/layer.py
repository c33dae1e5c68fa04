"""LayerNorm <-> LayerNormalization-17 (axis = first normalised axis), decomposed below opset 17.

A layer norm over the channel axis (layout="channels_first": a Keras LayerNormalization(axis=1), ConvNeXt's LayerNorm2d)
is the same op between two Transposes: channels moved last, normalised over the last axis, moved back.
LayerNormalization itself cannot say it (axis=1 would normalise every later axis too). Read back as a decomposition
normbridge emitted (decompositions.read: the metadata's spec, proved by rebuilding the same graph).
"""

from __future__ import annotations

from schemas.kinds import KIND_INFO

from . import decompositions, reading
from .layer_graph import INPUT, LayerGraph, op_version, stash_type

INFO = KIND_INFO["layer"]


class OnnxLayerNorm(decompositions.DecomposableAdapter):
    """layer <-> LayerNormalization (scale required: ones when the source has none; B omitted when absent)."""

    framework = "onnx"
    kind = "layer"
    #: bfloat16 tensors, float32 statistics of a bf16/fp16 layer (stash_type=1), and channels_first
    #: (Transposes around it).
    holds = frozenset({"dtype", "compute_dtype", "layout"})
    native_opset = INFO.onnx_opset

    def read_native(self, layer, report):
        return reading.read_trailing(layer, report, has_bias=True)

    def emit_native(self, g):
        inputs = list(g.affine(required=("scale",)))
        if g.spec.layout == "channels_first":
            x, back = channels_last(g)
            inputs = [x, *inputs] if inputs[-1] else [x, inputs[0]]
            y = g.node(INFO.onnx_op, inputs, axis=-1, epsilon=g.eps, stash_type=stash_type(g.spec.dtype))
            op = f"{INFO.onnx_op}-{op_version(INFO.onnx_op, g.opset)}"
            model = g.finish(
                back(y), f"Transpose+{op}+Transpose", native=False
            )  # native=True would name a Transpose the layer
            g.report.native = True  # the native op does the normalising
            return model
        return g.finish_native(
            INFO.onnx_op, inputs, axis=-len(g.spec.normalized_shape), epsilon=g.eps, stash_type=stash_type(g.spec.dtype)
        )

    def decompose(self, spec, options, report):
        if spec.layout == "channels_first":
            g = decompositions.start(spec, options, report)
            x, back = channels_last(g)
            y = decompositions.apply_affine(g, decompositions.normalize_trailing(g, x, 1, centre=True))
            return decompositions.finish(g, back(y))
        return decompositions.trailing_norm(spec, options, report, centre=True)


def channels_last(g: LayerGraph):
    """X with its channels (axis 1) moved last, and the function that moves a result's back;
    reported as the layout's fate."""
    rank = g.rank
    to_last = [0, *range(2, rank), 1]
    to_first = [0, rank - 1, *range(1, rank - 1)]
    g.report.add(
        "layout",
        "channels_first",
        f"Transpose{to_last}, over the last axis, Transpose{to_first}",
        "exact",
        "LayerNormalization's axis=1 would normalise every later axis too",
    )
    return g.node("Transpose", [INPUT], perm=to_last), (lambda y: g.node("Transpose", [y], perm=to_first))


ADAPTER = OnnxLayerNorm
