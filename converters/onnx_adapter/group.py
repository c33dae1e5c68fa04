"""GroupNorm <-> GroupNormalization-21 (per-channel affine), decomposed below opset 21.

GroupNormalization-18 (opsets 18-20) had one scale and bias per *group*; it is
deprecated and never emitted, but still read: each group's value is repeated over
its C/G channels, which is what that graph computes.
"""

from __future__ import annotations

import numpy as np

from schemas import LayerReport, NormSpec, SpecError
from schemas.kinds import KIND_INFO

from . import decompositions, metadata, reading
from .layer_graph import stash_type

INFO = KIND_INFO["group"]
OP = INFO.onnx_op
NATIVE_OPSET = INFO.onnx_opset


def per_channel(
    layer: reading.OnnxLayer, report: LayerReport, groups: int, tensors: list[np.ndarray]
) -> list[np.ndarray]:
    """Scale and bias per channel; GroupNormalization-18's per-group ones are repeated over each group's channels."""
    if layer.version >= NATIVE_OPSET:
        return tensors
    channels = layer.shape[1] if layer.rank is not None and layer.rank > 1 else None
    if channels is None:
        raise SpecError(
            f"{layer.layer_type} has per-group scale and bias, and the channel count of X {list(layer.shape or ['unranked'])} is unknown; "
            "give X a fixed dim 1 (C) so the per-channel values can be derived.",
            layer=layer.name,
            setting="num_features",
        )
    if channels % groups or any(t.shape != (groups,) for t in tensors):
        raise SpecError(
            f"{layer.layer_type} with num_groups={groups} needs scale and bias of shape [{groups}] and C={channels} divisible by it.",
            layer=layer.name,
            setting="num_groups",
        )
    report.warn(
        f"read from the deprecated {layer.layer_type} form: its per-group scale and bias were repeated over the {channels // groups} channels of each group."
    )
    return [np.repeat(t, channels // groups) for t in tensors]


def read_group_norm(layer: reading.OnnxLayer, report: LayerReport) -> NormSpec:
    meta = layer.metadata(report)
    fields = reading.common_fields(layer, report, meta)
    groups = int(layer.attribute("num_groups", 0))
    scale, bias = per_channel(layer, report, groups, [layer.tensor(1, "scale"), layer.tensor(2, "bias")])
    eps, eps_origin = metadata.eps(report, meta, layer.attribute("epsilon", reading.default_eps(layer)))
    fields.update(
        kind="group",
        num_features=layer.channels(scale),
        num_groups=groups,
        layout="channels_first",
        eps=eps,
        eps_origin=eps_origin,
        scale=metadata.affine_flag(report, meta, "scale", scale, 1.0),
        bias=metadata.affine_flag(report, meta, "bias", bias, 0.0),
    )
    return reading.build(
        fields, {"scale": scale if fields["scale"] else None, "bias": bias if fields["bias"] else None}
    )


class OnnxGroupNorm(decompositions.DecomposableAdapter):
    """group <-> GroupNormalization-21, or Reshape/InstanceNormalization/Reshape/Mul/Add below opset 21."""

    framework = "onnx"
    kind = "group"
    #: bfloat16 tensors, and float32 statistics of a bf16/fp16 layer (stash_type=1).
    holds = frozenset({"dtype", "compute_dtype"})
    native_opset = NATIVE_OPSET

    def read_native(self, layer, report):
        return read_group_norm(layer, report)

    def emit_native(self, g):
        return g.finish_native(
            OP, list(g.affine()), num_groups=g.spec.num_groups, epsilon=g.eps, stash_type=stash_type(g.spec.dtype)
        )

    def decompose(self, spec, options, report):
        return decompositions.group_norm(spec, options, report)


ADAPTER = OnnxGroupNorm
