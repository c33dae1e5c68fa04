"""The table of layer cases every harness runs: (id, spec, frameworks that must refuse it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from schemas import NormSpec

from tests.spec_factory import make_spec

F32_EPS = float(np.finfo(np.float32).eps)


#: Frameworks whose runtime cannot evaluate a dtype at all (checked: onnxruntime 1.32's CPU provider has no bfloat16
#: kernel for the normalization ops); their conversions are checked on the spec and the graph, not on outputs.
NO_RUNTIME = {"bfloat16": frozenset({"onnx"})}


@dataclass(frozen=True)
class Case:
    id: str
    spec: NormSpec
    #: frameworks whose from_spec must raise NotExpressibleError under default options
    refused_by: frozenset = field(default_factory=frozenset)
    #: frameworks that hold the case only as the stock layer computing it (converters/expressing.py: a scale offset
    #: folded into the scale, a cast moved after the affine): checked by `check`, not by exact pair conversions
    expressed_by: frozenset = field(default_factory=frozenset)

    @property
    def no_runtime(self) -> frozenset:
        """Frameworks that hold the case but cannot run it."""
        return NO_RUNTIME.get(self.spec.dtype, frozenset())


def _case(id: str, kind: str, refused_by=(), extended: dict | None = None, expressed_by=(), **kwargs) -> Case:
    """A row; `extended` sets schema-version-2 fields (compute_dtype, frozen, ...) on the factory's spec."""
    spec = make_spec(kind, name=id, **kwargs)
    return Case(id, spec.replace(**extended) if extended else spec, frozenset(refused_by), frozenset(expressed_by))


ALL = ("torch", "keras", "onnx")
#: A frozen BatchNorm (FrozenBatchNorm2d): no momentum, no estimator, no counter.
FROZEN = dict(frozen=True, momentum=None, momentum_convention=None, variance_estimator=None)


CASES: list[Case] = [
    _case("bn2d", "batch"),
    _case("bn1d", "batch", spatial_rank=1, eps=2e-5, momentum=0.3),
    _case("bn3d", "batch", spatial_rank=3, num_features=3),
    _case(
        "bn2d_keras_style",
        "batch",
        momentum=0.99,
        convention="running_weight",
        estimator="biased",
        layout="channels_last",
        nbt=None,
    ),
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
    _case("in2d_tracked", "instance", tracked=True, eps=1e-5, momentum=0.1),
    # bfloat16 and float16, and the settings of schema version 2 (issue 13).
    _case("bn2d_bfloat16", "batch", dtype="bfloat16", eps=1e-3),
    _case(
        "bn2d_float16_stats_f32",
        "batch",
        dtype="float16",
        eps=1e-3,
        extended=dict(compute_dtype="float32"),
        refused_by=("onnx",),
    ),
    _case("bn2d_frozen", "batch", eps=1e-5, nbt=None, extended=FROZEN),
    _case("bn2d_frozen_bfloat16", "batch", dtype="bfloat16", eps=1e-5, nbt=None, extended=FROZEN),
    _case("ln_bfloat16", "layer", normalized_shape=(8,), dtype="bfloat16", eps=1e-5),
    _case(
        "ln_bfloat16_stats_f32",
        "layer",
        normalized_shape=(8,),
        dtype="bfloat16",
        eps=1e-5,
        extended=dict(compute_dtype="float32"),
    ),
    _case(
        "ln_float16_stats_f32",
        "layer",
        normalized_shape=(4, 5),
        dtype="float16",
        eps=1e-3,
        extended=dict(compute_dtype="float32"),
    ),
    _case("rms_bfloat16", "rms", normalized_shape=(8,), dtype="bfloat16", eps=1e-6),
    _case(
        "rms_bfloat16_stats_f32",
        "rms",
        normalized_shape=(8,),
        dtype="bfloat16",
        eps=1e-6,
        extended=dict(compute_dtype="float32"),
    ),
    _case(
        "rms_float16_stats_f32",
        "rms",
        normalized_shape=(8,),
        dtype="float16",
        eps=1e-5,
        extended=dict(compute_dtype="float32"),
    ),
    # LlamaRMSNorm: the cast back to bf16 before the weight multiply; no stock layer rounds there, so each applies the
    # affine in float32 and casts once (one bf16 rounding apart, within the check's tolerance).
    _case(
        "rms_llama_cast_before_affine",
        "rms",
        normalized_shape=(8,),
        dtype="bfloat16",
        eps=1e-6,
        extended=dict(compute_dtype="float32", cast_before_affine=True),
        expressed_by=ALL,
    ),
    # GemmaRMSNorm: x * (1 + w); a stock layer holds 1 + w as its weight (the same float32 factor).
    _case(
        "rms_gemma_scale_offset",
        "rms",
        normalized_shape=(8,),
        eps=1e-6,
        extended=dict(scale_offset=1.0),
        expressed_by=ALL,
    ),
    _case("gn_bfloat16", "group", num_groups=3, dtype="bfloat16", eps=1e-5),
    _case(
        "gn_float16_stats_f32", "group", num_groups=3, dtype="float16", eps=1e-5, extended=dict(compute_dtype="float32")
    ),
    _case("in2d_bfloat16", "instance", dtype="bfloat16", eps=1e-5, momentum=None),
    _case("in2d_tracked_bfloat16", "instance", tracked=True, dtype="bfloat16", eps=1e-5, momentum=0.1),
    # Over the channel axis: torch's ChannelsFirstLayerNorm, ONNX's LayerNormalization between two Transposes
    # (issue 34, item 10).
    _case(
        "ln_channels_first",
        "layer",
        normalized_shape=(6,),
        eps=1e-6,
        extended=dict(layout="channels_first", input_rank=4),
    ),
    # Keras's RMSNormalization(axis=1) does not broadcast its scale over a rank-4 input (checked: keras 3.15),
    # so no stock layer holds it.
    _case(
        "rms_channels_first",
        "rms",
        normalized_shape=(6,),
        eps=1e-6,
        extended=dict(layout="channels_first", input_rank=4),
        refused_by=ALL,
    ),
]

CASES_BY_ID = {case.id: case for case in CASES}
