"""GroupNormalization (groups < channels) <-> group spec: statistics per (sample, group)."""

from __future__ import annotations

from typing import Any

from schemas import LayerReport, NormSpec, UnsupportedObjectError

from .. import markers
from ..options import ConversionOptions
from ..translate import record_layout
from .common import (
    AFFINE_VARIABLES,
    STORED_NOTE,
    KerasKindAdapter,
    build_rank,
    channels_last_shape,
    group_layer_kind,
    group_norm_channels,
    import_keras,
    read_facts,
    read_variables,
)


class KerasGroupAdapter(KerasKindAdapter):
    """keras.layers.GroupNormalization <-> kind "group"."""

    kind = "group"
    layer_classes = ("GroupNormalization",)

    def to_spec(self, obj: Any, report: LayerReport) -> NormSpec:
        layer = self.layer_of(obj)
        shape, layout, channels = group_norm_channels(layer)
        if group_layer_kind(layer) != "group":
            raise UnsupportedObjectError(
                f"the GroupNormalization has one group per channel ({channels}), which reads as kind 'instance', expected fewer groups; "
                "convert it through converters.to_spec().",
                layer=layer.name, setting="groups",
            )
        return read_facts(layer, report).spec(
            layer, "group", read_variables(layer, AFFINE_VARIABLES),
            num_features=channels,
            num_groups=int(layer.groups),
            input_rank=len(shape),
            layout=layout,
            scale=bool(layer.scale),
            bias=bool(layer.center),
        )

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> Any:
        common = self.begin_emit(spec, report)
        record_layout(report, spec, "channels_last")
        layer = import_keras().layers.GroupNormalization(groups=spec.num_groups, axis=-1, center=spec.bias, scale=spec.scale, **common)
        rank = build_rank(spec, report, 4)
        if spec.num_groups == spec.num_features and rank >= 3:
            # One group per channel reads back as InstanceNorm (common.group_layer_kind) without this.
            markers.remember(layer, kind="group")
            report.add("kind", "group", "group", "stored", "GroupNormalization with groups == channels reads as instance otherwise; " + STORED_NOTE)
        return self.finish_emit(layer, spec, report, channels_last_shape(spec.num_features, rank), AFFINE_VARIABLES)
