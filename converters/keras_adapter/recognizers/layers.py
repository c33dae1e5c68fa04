"""The stock keras.layers normalization layers: BatchNormalization, LayerNormalization,
RMSNormalization, GroupNormalization.

The class names are each kind's KindInfo.classes["keras"]. A class several kinds share is decided per
layer (GroupNormalization: one group per channel on a spatial input is an InstanceNorm).
"""

from __future__ import annotations

from typing import Any

from schemas.kinds import KIND_INFO

from ...adapter import owning_framework
from ...recognizers.base import ObjectRecognizer
from ..groups import group_layer_kind
from ..instance import is_tracked_instance
from ..runtime import import_keras

#: keras.layers class -> the kinds it computes, in KIND_INFO order.
CLASS_KINDS: dict[str, list[str]] = {}
for _kind, _info in KIND_INFO.items():
    for _name in _info.stock_classes("keras"):
        CLASS_KINDS.setdefault(_name, []).append(_kind)
#: How a layer of a class shared by several kinds is told apart.
DECIDE = {"GroupNormalization": group_layer_kind}


class KerasLayers(ObjectRecognizer):
    """A Keras layer that is an instance of a stock normalization class (checked in order)."""

    name = "keras.layers"
    framework = "keras"

    def kind_of(self, obj: Any) -> str | None:
        if owning_framework(obj, ("keras",)) != "keras":
            return None
        layers = import_keras().layers
        if is_tracked_instance(obj):
            return "instance"  # TrackedInstanceNormalization, a BatchNormalization subclass (keras_adapter/instance.py)
        for class_name, kinds in CLASS_KINDS.items():
            if isinstance(obj, getattr(layers, class_name)):
                return kinds[0] if len(kinds) == 1 else DECIDE[class_name](obj)
        return None


RECOGNIZER = KerasLayers()
