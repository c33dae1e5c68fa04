"""RMSNorm <-> RMSNormalization-23 (scale only), decomposed below opset 23."""

from __future__ import annotations

from schemas.kinds import KIND_INFO

from . import decompositions, reading
from .layer_graph import stash_type

INFO = KIND_INFO["rms"]


class OnnxRMSNorm(decompositions.DecomposableAdapter):
    """rms <-> RMSNormalization (scale required: ones when the source has none)."""

    framework = "onnx"
    kind = "rms"
    #: bfloat16 tensors, and float32 statistics of a bf16/fp16 layer (stash_type=1).
    holds = frozenset({"dtype", "compute_dtype"})
    native_opset = INFO.onnx_opset

    def read_native(self, layer, report):
        return reading.read_trailing(layer, report, has_bias=False)

    def emit_native(self, g):
        scale, _ = g.affine(required=("scale",))
        return g.finish_native(
            INFO.onnx_op,
            [scale],
            axis=-len(g.spec.normalized_shape),
            epsilon=g.eps,
            stash_type=stash_type(g.spec.dtype),
        )

    def decompose(self, spec, options, report):
        return decompositions.trailing_norm(spec, options, report, centre=False)


ADAPTER = OnnxRMSNorm
