"""GroupNormalization (groups < channels) <-> group spec: statistics per (sample, group)."""

from __future__ import annotations

from typing import Any

from schemas import LayerReport, NormSpec
from schemas.kinds import KIND_INFO

from .. import markers
from ..options import ConversionOptions
from ..translate import record_layout
from .facts import STORED_NOTE
from .groups import read_group_layer
from .kind_adapter import KerasKindAdapter
from .runtime import import_keras
from .shapes import build_rank, channels_last_shape
from .variables import AFFINE_VARIABLES


class KerasGroupAdapter(KerasKindAdapter):
    """keras.layers.GroupNormalization <-> kind "group"."""

    kind = "group"
    layer_classes = KIND_INFO["group"].classes["keras"]
    restatable = True  # from_spec: configuration, then finish_emit writes the tensors (KerasKindAdapter.restate)

    def to_spec(self, obj: Any, report: LayerReport) -> NormSpec:
        return read_group_layer(self.layer_of(obj), report, "group")

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> Any:
        common = self.begin_emit(spec, report)
        record_layout(report, spec, "channels_last")
        layer = import_keras().layers.GroupNormalization(groups=spec.num_groups, axis=-1, center=spec.bias, scale=spec.scale, **common)
        rank = build_rank(spec, report, 4)
        if spec.num_groups == spec.num_features and rank >= 3:
            # One group per channel reads back as InstanceNorm (groups.group_layer_kind) without this.
            markers.remember(layer, kind="group")
            report.add("kind", "group", "group", "stored", "GroupNormalization with groups == channels reads as instance otherwise; " + STORED_NOTE)
        return self.finish_emit(layer, spec, report, channels_last_shape(spec.num_features, rank), AFFINE_VARIABLES)


ADAPTER = KerasGroupAdapter
