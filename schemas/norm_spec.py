"""NormSpec: one normalization layer, framework-neutral, every knob explicit.

The spec stores values as the source framework gave them, with their convention
(momentum 0.1 `batch_weight` from PyTorch stays 0.1, it is not pre-converted to 0.9),
and never a framework default. Conversions happen only when an adapter emits a layer.

Formulas (x normalised over the reduction set R of the kind, per channel c where
the kind has channels):

- batch:    y = (x - mu_c) / sqrt(var_c + eps) * scale_c + bias_c, where (mu, var)
            are the running statistics at eval and the biased batch statistics in
            training mode (or always, when statistics are not tracked).
- instance: the same per (sample, channel) over the spatial axes; with tracked
            statistics PyTorch uses the running statistics at eval.
- group:    channels split into `num_groups` groups; statistics per (sample, group).
- layer:    statistics per sample over the trailing `normalized_shape` axes.
- rms:      y = x / sqrt(mean(x^2 over trailing axes) + eps) * scale.

A layer or rms spec with `layout` set normalises over the channel axis alone (ConvNeXt's and
timm's LayerNorm2d on NCHW inputs), `normalized_shape` being (C,).

The affine factor is `scale_offset + scale` (Gemma stores its weight as an offset from 1).
With a `compute_dtype`, the input is cast to it, statistics and normalisation are computed in
it, and the result is cast back to `dtype`: before scale and bias when `cast_before_affine`
(LlamaRMSNorm), after them otherwise (GemmaRMSNorm). The state tensors have `dtype`, or
`state_dtype` when set (equal to `compute_dtype`: a Keras mixed-policy layer's float32 variables).

One training step updates tracked statistics with the momentum in its convention and
the batch variance given by `variance_estimator`; a `frozen` spec (FrozenBatchNorm2d) uses its
running statistics in training mode too and a training step leaves them unchanged.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import SpecError
from .tensors import TensorMap
from .vocabulary import (
    KINDS,
    DType,
    EpsOrigin,
    Layout,
    MomentumConvention,
    SpecFramework,
    VarianceEstimator,
    registered,
)

SCHEMA_VERSION = 2

#: Settings added in schema version 2, with the value that means "as in version 1". An adapter
#: holds only those it lists in `KindAdapter.holds`; any other non-default one is refused.
EXTENDED_DEFAULTS: dict[str, Any] = {
    "compute_dtype": None,
    "state_dtype": None,
    "cast_before_affine": False,
    "scale_offset": 0.0,
    "frozen": False,
    "synchronized": False,
}
#: Fields left out of `config_dict` at their default, so a manifest's content digest stays what it was before they
#: existed.
DIGEST_QUIET_DEFAULTS: dict[str, Any] = {"state_dtype": None, "synchronized": False, "chosen_layout": None}


def known_kinds() -> tuple[str, ...]:
    """Every kind known now: the vocabulary's, then those registered at run time (schemas.kinds.register_kind)."""
    from .kinds import KIND_INFO  # late import, as in NormSpec._validate

    return tuple(KIND_INFO)


#: A spec's kind: one of KINDS or a kind registered at run time.
SpecKind = registered(KINDS, known_kinds)


class Source(BaseModel):
    """Where a spec was read from: provenance, never part of equivalence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    framework: SpecFramework = Field(description="Framework the layer was read from.")
    framework_version: str | None = Field(default=None, description="Version of that framework.")
    layer_type: str | None = Field(
        default=None, description="Class or op name, e.g. BatchNorm2d, BatchNormalization-15."
    )
    module_class: str | None = Field(
        default=None,
        description="Import path of the class a layer recognised by what it computes was read from "
        "(transformers.models.llama.modeling_llama.LlamaRMSNorm, a keras_hub RMSNormalization): converting back to its framework "
        "rebuilds that class where it is importable (Keras: registered or already imported, never imported for a spec) and "
        "normbridge knows its constructor, and proves the rebuilt layer equal.",
    )
    state_names: dict[str, str] | None = Field(
        default=None, description="The class's own names of the spec's tensors (scale -> weight), for rebuilding it."
    )


class NormSpec(BaseModel):
    """One normalization layer: configuration, mode, provenance and state tensors.

    Build one through `converters.to_spec(obj)` or directly; it is validated at
    construction and frozen afterwards (use `replace()` for a changed copy).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    schema_version: int = Field(
        default=SCHEMA_VERSION, description="Spec schema version; older ones are upgraded on read."
    )
    name: str = Field(default="norm", min_length=1, description="Layer name or path in its model.")
    kind: SpecKind = Field(description="batch, layer, rms, group or instance.")

    num_features: int | None = Field(default=None, ge=1, description="Channels C (batch, group, instance).")
    normalized_shape: tuple[int, ...] | None = Field(default=None, description="Trailing normalised dims (layer, rms).")
    spatial_rank: int | None = Field(
        default=None, ge=1, le=3, description="1, 2 or 3 for BatchNorm/InstanceNorm 1d/2d/3d."
    )
    input_rank: int | None = Field(
        default=None, ge=1, description="Rank of the input the layer was built for, when the framework records it."
    )
    layout: Layout | None = Field(
        default=None, description="Channel axis in the source framework (channel kinds only)."
    )
    chosen_layout: Layout | None = Field(
        default=None,
        description="The channel layout the layer was built with in a framework that offers both (a Keras axis=1 "
        "layer: channels_first); a conversion to such a framework builds it, the others keep it for the way back. None: that "
        "framework's natural layout (channel kinds only).",
    )
    num_groups: int | None = Field(default=None, ge=1, description="Groups (group kind).")

    eps: float = Field(description="Epsilon added to the variance, exactly as the source gave it.")
    eps_origin: EpsOrigin = Field(
        default="explicit",
        description="dtype_eps: PyTorch RMSNorm eps=None (finfo of its computation dtype: float32 for 16-bit layers).",
    )

    momentum: float | None = Field(
        default=None,
        description="Momentum as given, read with momentum_convention; None with tracked statistics means a cumulative average.",
    )
    momentum_convention: MomentumConvention | None = Field(
        default=None, description="batch_weight (PyTorch) or running_weight (Keras, ONNX)."
    )
    track_running_stats: bool = Field(default=False, description="Running statistics are kept and used at eval.")
    variance_estimator: VarianceEstimator | None = Field(
        default=None, description="Estimator of the batch variance that updates running_var."
    )

    scale: bool = Field(default=True, description="A learned scale (gamma) is applied.")
    bias: bool = Field(default=True, description="A learned bias (beta) is added.")
    training: bool = Field(default=False, description="The layer was in training mode.")
    dtype: DType = Field(
        default="float32", description="Parameter and input dtype (the computation's too, unless compute_dtype is set)."
    )
    compute_dtype: DType | None = Field(
        default=None,
        description="Dtype the statistics and the normalisation are computed in when it differs from dtype "
        "(float32 for a bf16/fp16 layer: torch's explicit upcast, ONNX stash_type=1, Keras mixed policies).",
    )
    state_dtype: DType | None = Field(
        default=None,
        description="Dtype of the state tensors when it differs from dtype: compute_dtype, the affine then "
        "applied with them in it (a Keras mixed-policy layer's float32 variables that are not exact bf16/fp16 values).",
    )
    cast_before_affine: bool = Field(
        default=False,
        description="With compute_dtype: cast the normalised value back to dtype before scale and bias "
        "(LlamaRMSNorm: weight * h.to(x.dtype)); False applies them in compute_dtype, then casts (GemmaRMSNorm).",
    )
    scale_offset: float = Field(
        default=0.0, description="The affine factor is scale_offset + scale: 1.0 for Gemma's x * (1 + weight)."
    )
    frozen: bool = Field(
        default=False,
        description="Running statistics are constants (FrozenBatchNorm2d): used in training mode too, "
        "never updated; no momentum.",
    )
    synchronized: bool = Field(
        default=False,
        description="A training step averages the batch statistics across the replicas of a distributed run "
        "(Keras synchronized=True, PyTorch SyncBatchNorm); one replica computes what an unsynchronized layer does (kind batch).",
    )

    source: Source = Field(default_factory=lambda: Source(framework="spec"), description="Provenance.")
    tensors: TensorMap = Field(default_factory=dict, description="State tensors by name.")

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """Documents of an older schema version (stored manifests, spec.json) are upgraded on read."""
        if (
            isinstance(data, dict)
            and isinstance(data.get("schema_version"), int)
            and 1 <= data["schema_version"] < SCHEMA_VERSION
        ):
            data = dict(data)
            # 1 -> 2: the settings of EXTENDED_DEFAULTS appear, at the values that mean what version 1 computed.
            data["schema_version"] = SCHEMA_VERSION
        return data

    @model_validator(mode="after")
    def _validate(self) -> "NormSpec":
        from .kinds import validate_spec  # late import: kinds import this module

        if self.schema_version != SCHEMA_VERSION:
            raise SpecError(
                f"schema_version {self.schema_version} is not the current {SCHEMA_VERSION}; load it through schemas.load_spec(), which upgrades old versions.",
                layer=self.name,
            )
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise SpecError(f"eps must be a positive finite number (got {self.eps!r}).", layer=self.name, setting="eps")
        if self.momentum is not None:
            if not (math.isfinite(self.momentum) and 0.0 <= self.momentum <= 1.0):
                raise SpecError(
                    f"momentum must lie in [0, 1] (got {self.momentum!r}).", layer=self.name, setting="momentum"
                )
            if self.momentum_convention is None:
                raise SpecError(
                    "a momentum needs its convention (batch_weight or running_weight).",
                    layer=self.name,
                    setting="momentum_convention",
                )
        self._validate_extended()
        validate_spec(self)
        return self

    def _validate_extended(self) -> None:
        if self.compute_dtype == self.dtype:
            raise SpecError(
                f"compute_dtype equals dtype ({self.dtype}); leave it None.", layer=self.name, setting="compute_dtype"
            )
        if self.state_dtype is not None and (self.state_dtype != self.compute_dtype or self.cast_before_affine):
            raise SpecError(
                f"state_dtype {self.state_dtype} must be the compute_dtype ({self.compute_dtype}) the affine is applied in "
                "(cast_before_affine off); leave it None for state in dtype.",
                layer=self.name,
                setting="state_dtype",
            )
        if self.cast_before_affine and self.compute_dtype is None:
            raise SpecError(
                "cast_before_affine needs a compute_dtype to cast from.", layer=self.name, setting="cast_before_affine"
            )
        if not math.isfinite(self.scale_offset):
            raise SpecError(
                f"scale_offset must be finite (got {self.scale_offset!r}).", layer=self.name, setting="scale_offset"
            )
        if self.synchronized and (self.kind != "batch" or not self.track_running_stats or self.frozen):
            raise SpecError(
                "synchronized applies to a batch normalization whose training step computes batch statistics "
                "(tracked, not frozen); set synchronized=False.",
                layer=self.name,
                setting="synchronized",
            )
        if self.chosen_layout is not None and self.layout is None:
            raise SpecError(
                "chosen_layout applies to channel kinds (those with a layout); leave it None.",
                layer=self.name,
                setting="chosen_layout",
            )
        if self.scale_offset != 0.0 and not self.scale:
            raise SpecError(
                "scale_offset applies to a learned scale; set scale=True or scale_offset=0.",
                layer=self.name,
                setting="scale_offset",
            )

    def extended_settings(self) -> dict[str, Any]:
        """The settings beyond schema version 1's vocabulary this spec uses (what an adapter must hold to convert
        it)."""
        used = {
            name: getattr(self, name) for name, default in EXTENDED_DEFAULTS.items() if getattr(self, name) != default
        }
        if self.dtype == "bfloat16":
            used["dtype"] = self.dtype
        if self.normalized_shape is not None and self.layout is not None:
            used["layout"] = self.layout  # a trailing kind over the channel axis
        return used

    # -- conveniences -------------------------------------------------------------

    def momentum_as(self, convention: str) -> float | None:
        """The momentum in `convention`, complemented on its decimal so it round-trips."""
        from .floats import decimal_complement

        if self.momentum is None:
            return None
        if convention == self.momentum_convention:
            return self.momentum
        return decimal_complement(self.momentum)

    @property
    def channel_axis(self) -> int | None:
        """Axis of the channels in the layer's own layout (None for layer/rms)."""
        if self.layout is None:
            return None
        return 1 if self.layout == "channels_first" else -1

    def replace(self, **changes: Any) -> "NormSpec":
        """A validated copy with `changes` applied (the spec itself never changes)."""
        data = {name: getattr(self, name) for name in type(self).model_fields}
        data.update(changes)
        return NormSpec(**data)

    def config_dict(self) -> dict:
        """Every field but the tensors, as JSON-ready Python values; those of DIGEST_QUIET_DEFAULTS only when set,
        because the manifest's content digest hashes this dict: a model registered before the field existed must keep
        its digest (and deduplicate)."""
        config = self.model_dump(mode="json", exclude={"tensors"})
        for name, default in DIGEST_QUIET_DEFAULTS.items():
            if config.get(name, default) == default:
                config.pop(name, None)
        return config

    def __eq__(self, other: object) -> bool:
        from .compare import spec_differences

        if not isinstance(other, NormSpec):
            return NotImplemented
        return not spec_differences(self, other, ignore=())

    __hash__ = None  # type: ignore[assignment]
