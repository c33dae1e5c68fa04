"""GroupNormalization (groups < channels) <-> group spec: statistics per (sample, group)."""

from __future__ import annotations

from typing import Any

from schemas import LayerReport, NormSpec
from schemas.kinds import KIND_INFO

from .. import markers
from ..options import ConversionOptions
from .deferred import channel_build_shape, deferred_spec, is_deferred
from .facts import STORED_NOTE
from .groups import read_group_layer
from .kind_adapter import KerasKindAdapter
from .layouts import emit_layout
from .runtime import import_keras
from .variables import AFFINE_VARIABLES


class KerasGroupAdapter(KerasKindAdapter):
    """keras.layers.GroupNormalization <-> kind "group"."""

    kind = "group"
    layer_classes = KIND_INFO["group"].classes["keras"]
    restatable = True  # from_spec: configuration, then finish_emit writes the tensors (KerasKindAdapter.restate)

    def to_spec(self, obj: Any, report: LayerReport) -> NormSpec:
        layer = self.layer_of(obj)
        if is_deferred(layer):  # not built yet: what its first call builds
            return deferred_spec(layer, lambda built: read_group_layer(built, report, "group"))
        return read_group_layer(layer, report, "group")

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> Any:
        common = self.begin_emit(spec, report)
        axis, layout = emit_layout(spec, report)
        layer = import_keras().layers.GroupNormalization(
            groups=spec.num_groups, axis=axis, center=spec.bias, scale=spec.scale, **common
        )
        shape = channel_build_shape(spec, report, 4, layout=layout)
        if spec.num_groups == spec.num_features and (shape is None or len(shape) >= 3):
            # One group per channel reads back as InstanceNorm (groups.group_layer_kind) without this.
            markers.remember(layer, kind="group")
            report.add(
                "kind",
                "group",
                "group",
                "stored",
                "GroupNormalization with groups == channels reads as instance otherwise; " + STORED_NOTE,
            )
        return self.finish_emit(layer, spec, report, shape, AFFINE_VARIABLES)


ADAPTER = KerasGroupAdapter
