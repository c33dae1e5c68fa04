"""LayerNorm: statistics per sample over the trailing `normalized_shape` axes; elementwise affine."""

from __future__ import annotations

from ._checks import check_fields, check_tensors
from .info import KindInfo

INFO = KindInfo(
    kind="layer",
    summary="statistics per sample over the trailing normalized_shape axes; elementwise affine",
    trailing=True,
    running_stats=False,
    bias=True,
    required=("normalized_shape",),
    forbidden=("num_features", "num_groups", "spatial_rank"),
    classes={"torch": ("LayerNorm",), "keras": ("LayerNormalization",)},
    default_eps={"torch": 1e-5, "keras": 1e-3, "onnx": 1e-5},
    onnx_op="LayerNormalization",
    onnx_opset=17,
    onnx_inputs=("scale", "bias"),
    aten_ops=("aten::layer_norm", "aten::native_layer_norm"),
)


def validate(spec) -> None:
    check_fields(INFO, spec)
    check_tensors(INFO, spec)
