"""GroupNorm: channels split into groups, statistics per (sample, group); per-channel affine."""

from __future__ import annotations

from ..errors import SpecError
from ._checks import check_fields, check_tensors
from .info import KindInfo

INFO = KindInfo(
    kind="group",
    summary="channels split into groups, statistics per (sample, group); per-channel affine",
    trailing=False,
    running_stats=False,
    bias=True,
    required=("num_features", "num_groups", "layout"),
    forbidden=("normalized_shape", "spatial_rank"),
    classes={"torch": ("GroupNorm",), "keras": ("GroupNormalization",)},
    default_eps={"torch": 1e-5, "keras": 1e-3, "onnx": 1e-5},
    onnx_op="GroupNormalization",
    # GroupNormalization-18 had per-group scale and bias and is deprecated: normbridge writes -21.
    onnx_opset=21,
    onnx_inputs=("scale", "bias"),
    aten_ops=("aten::group_norm", "aten::native_group_norm"),
)


def validate(spec) -> None:
    check_fields(INFO, spec)
    if spec.num_features % spec.num_groups != 0:
        raise SpecError(
            f"num_features {spec.num_features} is not divisible by num_groups {spec.num_groups}.",
            layer=spec.name,
            setting="num_groups",
        )
    check_tensors(INFO, spec)
