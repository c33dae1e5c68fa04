"""RMSNorm: x / sqrt(mean(x^2) + eps) * scale over trailing axes; no centring and no bias."""

from __future__ import annotations

from ..errors import SpecError
from ._checks import expect_tensor_shapes, forbid, forbid_running_stats, require
from .trailing import check_normalized_shape


def validate(spec) -> None:
    require(spec, "normalized_shape")
    forbid(spec, "num_features", "num_groups", "layout", "spatial_rank")
    forbid_running_stats(spec)
    if spec.bias:
        raise SpecError("RMSNorm has no bias in PyTorch, Keras or ONNX; set bias=False.", layer=spec.name, setting="bias")
    check_normalized_shape(spec)
    expect_tensor_shapes(spec, tuple(spec.normalized_shape))
