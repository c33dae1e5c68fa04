"""BatchNorm: per-channel statistics over batch and spatial axes; running statistics at eval."""

from __future__ import annotations

from ._checks import check_fields, check_tensors
from .info import KindInfo

INFO = KindInfo(
    kind="batch",
    summary="per-channel statistics over the batch and spatial axes; running statistics at eval",
    trailing=False,
    running_stats=True,
    bias=True,
    required=("num_features", "spatial_rank", "layout"),
    forbidden=("normalized_shape", "num_groups"),
    classes={"torch": ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"), "keras": ("BatchNormalization",)},
    default_eps={"torch": 1e-5, "keras": 1e-3, "onnx": 1e-5},
    onnx_op="BatchNormalization",
    onnx_opset=9,
    onnx_inputs=("scale", "bias", "running_mean", "running_var"),
    # torch.export's training IR, then the core-aten forms of run_decompositions() (eval, train, no statistics).
    aten_ops=(
        "aten::batch_norm",
        "aten::native_batch_norm",
        "aten::_native_batch_norm_legit",
        "aten::_native_batch_norm_legit_no_training",
        "aten::_native_batch_norm_legit_functional",
    ),
)


def validate(spec) -> None:
    check_fields(INFO, spec)
    check_tensors(INFO, spec)
