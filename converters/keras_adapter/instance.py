"""GroupNormalization with one group per channel <-> instance spec without running statistics."""

from __future__ import annotations

from typing import Any

from schemas import LayerReport, NormSpec, NotExpressibleError
from schemas.kinds import KIND_INFO

from .. import markers
from ..options import ConversionOptions
from ..translate import record_layout
from .groups import read_group_layer
from .facts import STORED_NOTE
from .kind_adapter import KerasKindAdapter
from .runtime import import_keras
from .shapes import build_rank, channels_last_shape
from .variables import AFFINE_VARIABLES


class KerasInstanceAdapter(KerasKindAdapter):
    """keras.layers.GroupNormalization(groups=-1) <-> kind "instance" (Keras has no InstanceNorm layer)."""

    kind = "instance"
    layer_classes = KIND_INFO["instance"].classes["keras"]

    def to_spec(self, obj: Any, report: LayerReport) -> NormSpec:
        return read_group_layer(self.layer_of(obj), report, "instance")

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> Any:
        common = self.begin_emit(spec, report)
        if spec.track_running_stats:
            raise NotExpressibleError(
                "track_running_stats=True normalises per instance in training but with running statistics at inference, and no Keras layer "
                "does both; convert a copy with track_running_stats=False (per-instance statistics always) if that is what you need.",
                layer=spec.name, setting="track_running_stats", target="keras",
            )
        record_layout(report, spec, "channels_last")
        # groups=-1: one group per channel, Keras's documented instance normalisation.
        layer = import_keras().layers.GroupNormalization(groups=-1, axis=-1, center=spec.bias, scale=spec.scale, **common)
        rank = build_rank(spec, report, spec.spatial_rank + 2, minimum=3)
        if spec.momentum is not None:  # unused without tracked statistics; GroupNormalization has none
            report.add("momentum", spec.momentum, spec.momentum, "stored", "unused: statistics are not tracked; " + STORED_NOTE)
            markers.remember(layer, momentum=spec.momentum, momentum_convention=spec.momentum_convention)
        return self.finish_emit(layer, spec, report, channels_last_shape(spec.num_features, rank), AFFINE_VARIABLES)


ADAPTER = KerasInstanceAdapter
