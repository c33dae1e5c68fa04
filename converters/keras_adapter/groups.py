"""GroupNormalization read as kind group or instance: one group per channel on a spatial input is an InstanceNorm."""

from __future__ import annotations

from typing import Any

from schemas import LayerReport, NormSpec, UnsupportedObjectError

from .. import markers
from .facts import read_facts
from .layouts import chosen_layout_of
from .shapes import built_input_shape, channel_layout, spatial_rank_of
from .variables import AFFINE_VARIABLES, read_variables


def group_norm_channels(layer: Any) -> tuple[tuple[int | None, ...], str, int]:
    """(built input shape, layout, channels) of a GroupNormalization."""
    shape = built_input_shape(layer)
    layout = channel_layout(layer, layer.axis, len(shape))
    return shape, layout, int(shape[layer.axis])


def group_layer_kind(layer: Any) -> str:
    """instance or group, the rule kind_of and the adapters share.

    build() overwrites groups=-1 with the channel count (keras/src/layers/normalization/
    group_normalization.py), so one group per channel reads as InstanceNorm unless the
    layer was emitted from a group spec (marker kind="group"). A rank-2 input has no
    spatial axes, so it stays a GroupNorm.
    """
    if not layer.built:
        return "instance" if layer.groups == -1 else "group"
    shape = built_input_shape(layer)
    if layer.groups != shape[layer.axis] or len(shape) < 3:
        return "group"
    return "group" if markers.recall(layer).get("kind") == "group" else "instance"


def _remembered_momentum(layer: Any) -> dict[str, Any]:
    """The unused momentum an untracked InstanceNorm had, remembered on the layer (GroupNormalization has none)."""
    remembered = markers.recall(layer)
    value, convention = remembered.get("momentum"), remembered.get("momentum_convention")
    if isinstance(value, float) and convention in ("batch_weight", "running_weight"):
        return {"momentum": value, "momentum_convention": convention}
    return {}


def read_group_layer(layer: Any, report: LayerReport, kind: str, **fields: Any) -> NormSpec:
    """The spec of a GroupNormalization read as `kind` ("group" or "instance"), refusing the other reading."""
    shape, layout, channels = group_norm_channels(layer)
    found = group_layer_kind(layer)
    if found != kind:
        raise UnsupportedObjectError(
            f"the GroupNormalization has {layer.groups} groups for {channels} channels on a rank-{len(shape)} input, which reads as kind "
            f"'{found}', expected kind '{kind}'; convert it through converters.to_spec().",
            layer=layer.name,
            setting="groups",
        )
    if kind == "group":
        fields["num_groups"] = int(layer.groups)
    else:
        fields.update(
            spatial_rank=spatial_rank_of(layer, len(shape), 3), track_running_stats=False, **_remembered_momentum(layer)
        )
    return read_facts(layer, report).spec(
        layer,
        kind,
        read_variables(layer, AFFINE_VARIABLES),
        num_features=channels,
        input_rank=len(shape),
        layout=layout,
        chosen_layout=chosen_layout_of(layout),
        scale=bool(layer.scale),
        bias=bool(layer.center),
        **fields,
    )
