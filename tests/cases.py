"""The table of layer cases every harness runs: (id, spec, frameworks that must refuse it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from schemas import NormSpec

from .spec_factory import make_spec

F32_EPS = float(np.finfo(np.float32).eps)


@dataclass(frozen=True)
class Case:
    id: str
    spec: NormSpec
    #: frameworks whose from_spec must raise NotExpressibleError under default options
    refused_by: frozenset = field(default_factory=frozenset)


def _case(id: str, kind: str, refused_by=(), **kwargs) -> Case:
    return Case(id, make_spec(kind, name=id, **kwargs), frozenset(refused_by))


CASES: list[Case] = [
    _case("bn2d", "batch"),
    _case("bn1d", "batch", spatial_rank=1, eps=2e-5, momentum=0.3),
    _case("bn3d", "batch", spatial_rank=3, num_features=3),
    _case("bn2d_keras_style", "batch", momentum=0.99, convention="running_weight", estimator="biased", layout="channels_last", nbt=None),
    _case("bn2d_no_affine", "batch", scale=False, bias=False),
    _case("bn2d_bias_only", "batch", scale=False, bias=True),
    _case("bn2d_scale_only", "batch", scale=True, bias=False),
    _case("bn2d_float64", "batch", dtype="float64", eps=1e-7),
    _case("bn2d_float16", "batch", dtype="float16", eps=1e-3),
    _case("bn2d_cumulative", "batch", momentum=None, refused_by=("keras", "onnx")),
    _case("bn2d_untracked", "batch", tracked=False, momentum=0.1, refused_by=("keras", "onnx")),
    _case("bn2d_train_mode", "batch", training=True, refused_by=("onnx",)),
    _case("ln_last", "layer", normalized_shape=(5,), eps=1e-5),
    _case("ln_two_axes", "layer", normalized_shape=(4, 5), eps=1e-3),
    _case("ln_no_bias", "layer", normalized_shape=(5,), bias=False, eps=2e-6),
    _case("ln_no_affine", "layer", normalized_shape=(3, 4), scale=False, bias=False),
    _case("ln_float64", "layer", normalized_shape=(6,), dtype="float64", eps=1e-9),
    _case("rms_last", "rms", normalized_shape=(8,), eps=1e-6),
    _case("rms_two_axes", "rms", normalized_shape=(3, 4), eps=1e-5),
    _case("rms_dtype_eps", "rms", normalized_shape=(8,), eps=F32_EPS, eps_origin="dtype_eps"),
    _case("rms_no_scale", "rms", normalized_shape=(6,), scale=False, eps=1e-5),
    _case("gn_3_groups", "group", num_groups=3, eps=1e-3),
    _case("gn_1_group", "group", num_groups=1, eps=1e-5),
    _case("gn_channels_last", "group", num_groups=2, layout="channels_last", eps=1e-4),
    _case("gn_no_affine", "group", num_groups=2, scale=False, bias=False),
    _case("in2d", "instance", eps=1e-5, momentum=None),
    _case("in1d_affine", "instance", spatial_rank=1, eps=1e-3, momentum=None, num_features=4),
    _case("in2d_channels_last", "instance", layout="channels_last", eps=1e-4, momentum=None),
    _case("in2d_tracked", "instance", tracked=True, eps=1e-5, momentum=0.1, refused_by=("keras",)),
]

CASES_BY_ID = {case.id: case for case in CASES}
