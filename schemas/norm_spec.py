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

One training step updates tracked statistics with the momentum in its convention and
the batch variance given by `variance_estimator`.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import SpecError
from .tensors import TensorMap
from .vocabulary import DType, EpsOrigin, Framework, Kind, Layout, MomentumConvention, VarianceEstimator

SCHEMA_VERSION = 1


class Source(BaseModel):
    """Where a spec was read from: provenance, never part of equivalence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    framework: Framework = Field(description="Framework the layer was read from.")
    framework_version: str | None = Field(default=None, description="Version of that framework.")
    layer_type: str | None = Field(default=None, description="Class or op name, e.g. BatchNorm2d, BatchNormalization-15.")


class NormSpec(BaseModel):
    """One normalization layer: configuration, mode, provenance and state tensors.

    Build one through `converters.to_spec(obj)` or directly; it is validated at
    construction and frozen afterwards (use `replace()` for a changed copy).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    schema_version: int = Field(default=SCHEMA_VERSION, description="Spec schema version; older ones are upgraded on read.")
    name: str = Field(default="norm", min_length=1, description="Layer name or path in its model.")
    kind: Kind = Field(description="batch, layer, rms, group or instance.")

    num_features: int | None = Field(default=None, ge=1, description="Channels C (batch, group, instance).")
    normalized_shape: tuple[int, ...] | None = Field(default=None, description="Trailing normalised dims (layer, rms).")
    spatial_rank: int | None = Field(default=None, ge=1, le=3, description="1, 2 or 3 for BatchNorm/InstanceNorm 1d/2d/3d.")
    input_rank: int | None = Field(default=None, ge=1, description="Rank of the input the layer was built for, when the framework records it.")
    layout: Layout | None = Field(default=None, description="Channel axis in the source framework (channel kinds only).")
    num_groups: int | None = Field(default=None, ge=1, description="Groups (group kind).")

    eps: float = Field(description="Epsilon added to the variance, exactly as the source gave it.")
    eps_origin: EpsOrigin = Field(default="explicit", description="dtype_eps: PyTorch RMSNorm eps=None (finfo(dtype).eps).")

    momentum: float | None = Field(default=None, description="Momentum as given, read with momentum_convention; None with tracked statistics means a cumulative average.")
    momentum_convention: MomentumConvention | None = Field(default=None, description="batch_weight (PyTorch) or running_weight (Keras, ONNX).")
    track_running_stats: bool = Field(default=False, description="Running statistics are kept and used at eval.")
    variance_estimator: VarianceEstimator | None = Field(default=None, description="Estimator of the batch variance that updates running_var.")

    scale: bool = Field(default=True, description="A learned scale (gamma) is applied.")
    bias: bool = Field(default=True, description="A learned bias (beta) is added.")
    training: bool = Field(default=False, description="The layer was in training mode.")
    dtype: DType = Field(default="float32", description="Parameter and computation dtype.")

    source: Source = Field(default_factory=lambda: Source(framework="spec"), description="Provenance.")
    tensors: TensorMap = Field(default_factory=dict, description="State tensors by name.")

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
                raise SpecError(f"momentum must lie in [0, 1] (got {self.momentum!r}).", layer=self.name, setting="momentum")
            if self.momentum_convention is None:
                raise SpecError("a momentum needs its convention (batch_weight or running_weight).", layer=self.name, setting="momentum_convention")
        validate_spec(self)
        return self

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
        """Every field but the tensors, as JSON-ready Python values."""
        return self.model_dump(mode="json", exclude={"tensors"})

    def __eq__(self, other: object) -> bool:
        from .compare import spec_differences

        if not isinstance(other, NormSpec):
            return NotImplemented
        return not spec_differences(self, other, ignore=())

    __hash__ = None  # type: ignore[assignment]
