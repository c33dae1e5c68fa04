"""RMSNorm: x / sqrt(mean(x^2) + eps) * scale over trailing axes; no centring and no bias."""

from __future__ import annotations

from ..errors import SpecError
from ._checks import check_fields, check_tensors
from .info import KindInfo

INFO = KindInfo(
    kind="rms",
    summary="x / sqrt(mean(x^2) + eps) * scale over the trailing normalized_shape axes; no centring, no bias",
    trailing=True,
    running_stats=False,
    bias=False,
    required=("normalized_shape",),
    forbidden=("num_features", "num_groups", "spatial_rank"),
    classes={"torch": ("RMSNorm",), "keras": ("RMSNormalization",)},
    # PyTorch's RMSNorm defaults to eps=None: the eps of the dtype it computes in (floats.dtype_default_eps).
    default_eps={"torch": None, "keras": 1e-6, "onnx": 1e-5},
    onnx_op="RMSNormalization",
    onnx_opset=23,
    onnx_inputs=("scale",),
    aten_ops=("aten::rms_norm", "aten::_fused_rms_norm"),
)


def validate(spec) -> None:
    check_fields(INFO, spec)
    if spec.bias:
        raise SpecError(
            "RMSNorm has no bias in PyTorch, Keras or ONNX; set bias=False.", layer=spec.name, setting="bias"
        )
    check_tensors(INFO, spec)
