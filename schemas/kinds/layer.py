"""LayerNorm: statistics per sample over the trailing `normalized_shape` axes; elementwise affine."""

from __future__ import annotations

from ._checks import forbid, forbid_running_stats, expect_tensor_shapes, require
from .trailing import check_normalized_shape


def validate(spec) -> None:
    require(spec, "normalized_shape")
    forbid(spec, "num_features", "num_groups", "layout", "spatial_rank")
    forbid_running_stats(spec)
    check_normalized_shape(spec)
    expect_tensor_shapes(spec, tuple(spec.normalized_shape))
