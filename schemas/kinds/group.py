"""GroupNorm: channels split into groups, statistics per (sample, group); per-channel affine."""

from __future__ import annotations

from ..errors import SpecError
from ._checks import expect_tensor_shapes, forbid, forbid_running_stats, require


def validate(spec) -> None:
    require(spec, "num_features", "num_groups", "layout")
    forbid(spec, "normalized_shape", "spatial_rank")
    forbid_running_stats(spec)
    if spec.num_features % spec.num_groups != 0:
        raise SpecError(
            f"num_features {spec.num_features} is not divisible by num_groups {spec.num_groups}.", layer=spec.name, setting="num_groups"
        )
    expect_tensor_shapes(spec, (spec.num_features,))
