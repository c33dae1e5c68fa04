"""InstanceNorm: per-(sample, channel) statistics over spatial axes; optionally tracked running statistics."""

from __future__ import annotations

from ._checks import check_fields, check_tensors
from .info import KindInfo

INFO = KindInfo(
    kind="instance",
    summary="per-(sample, channel) statistics over the spatial axes; optionally tracked running statistics",
    trailing=False,
    running_stats=True,
    bias=True,
    required=("num_features", "spatial_rank", "layout"),
    forbidden=("normalized_shape", "num_groups"),
    # Keras has no InstanceNorm layer: GroupNormalization with one group per channel is one.
    classes={"torch": ("InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"), "keras": ("GroupNormalization",)},
    default_eps={"torch": 1e-5, "keras": 1e-3, "onnx": 1e-5},
    onnx_op="InstanceNormalization",
    onnx_opset=6,
    onnx_inputs=("scale", "bias"),
    aten_ops=("aten::instance_norm",),
)


def validate(spec) -> None:
    check_fields(INFO, spec)
    check_tensors(INFO, spec)
