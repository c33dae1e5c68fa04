"""ScaleNorm's facts and rules, as a `schemas/kinds/<kind>.py` module holds them: no ONNX op, no stock class."""

from __future__ import annotations

from schemas.errors import SpecError
from schemas.kinds import KindInfo
from schemas.kinds._checks import check_fields, check_tensors

INFO = KindInfo(
    kind="scalenorm",
    summary="scale * x / max(||x||_2, eps) over the last axis; no centring, no bias",
    trailing=True,
    running_stats=False,
    bias=False,
    required=("normalized_shape",),
    forbidden=("num_features", "num_groups", "spatial_rank"),
    default_eps={"toynp": 1e-5},
)


def validate(spec) -> None:
    check_fields(INFO, spec)
    if spec.bias:
        raise SpecError("ScaleNorm has no bias; set bias=False.", layer=spec.name, setting="bias")
    if len(spec.normalized_shape) != 1:
        raise SpecError("ScaleNorm normalises over the last axis alone.", layer=spec.name, setting="normalized_shape")
    check_tensors(INFO, spec)
