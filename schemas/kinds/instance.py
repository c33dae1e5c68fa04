"""InstanceNorm: per-(sample, channel) statistics over spatial axes; optionally tracked running statistics."""

from __future__ import annotations

from ._checks import expect_tensor_shapes, forbid, require, require_running_stats_fields


def validate(spec) -> None:
    require(spec, "num_features", "spatial_rank", "layout")
    forbid(spec, "normalized_shape", "num_groups")
    require_running_stats_fields(spec)
    expect_tensor_shapes(spec, (spec.num_features,))
