"""Hazards grouped for a reader: one line per distinct hazard, with the layers it was found at.

An EfficientNetV2B0 built without weights has 59 BatchNorms that each carry the same `never_trained`
warning; printing it once per layer buried everything else. Here hazards with the same code, severity,
blocking flag and message (the layer's own name taken out of the message) become one group listing
its layers, and a long list of layers is elided past a few ("bn1, bn2, bn3 and 56 more"). Only the
human-readable output groups: `--json` and the HTTP API keep one entry per layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Layers named in a group's line before the rest are counted ("... and 56 more").
SHOWN_LAYERS = 3
#: How a layer-level hazard with no layer (a model-level one) is named.
MODEL_LEVEL = "(model)"
#: What stands for a layer's own name inside a grouped message.
THE_LAYER = "the layer"


@dataclass(frozen=True)
class HazardGroup:
    """One hazard as a reader sees it: the message once, every layer it was found at, in order."""

    code: str
    severity: str
    message: str
    layers: tuple[str, ...]
    blocking: bool = False

    def layers_text(self, shown: int = SHOWN_LAYERS) -> str:
        return elided_layers(self.layers, shown)


def elided_layers(layers: Sequence[str], shown: int = SHOWN_LAYERS) -> str:
    """'bn1, bn2, bn3 and 56 more'; the whole list when at most one more than `shown` (naming it costs no more)."""
    if len(layers) <= shown + 1:
        return ", ".join(layers)
    return f"{', '.join(layers[:shown])} and {len(layers) - shown} more"


def _message_without(message: str, layer: str | None) -> str:
    return message.replace(layer, THE_LAYER) if layer and layer != MODEL_LEVEL else message


def group_hazards(entries: Iterable[tuple[str | None, str, str, str, bool]]) -> list[HazardGroup]:
    """Groups of (layer or None, code, severity, message, blocking) entries, in order of first appearance.

    A group of one keeps its message word for word; a larger group's message names its layers "the layer".
    """
    order: list[tuple] = []
    members: dict[tuple, list[tuple[str, str]]] = {}
    for layer, code, severity, message, blocking in entries:
        where = layer if layer is not None else MODEL_LEVEL
        key = (code, severity, bool(blocking), _message_without(message, where))
        if key not in members:
            order.append(key)
            members[key] = []
        members[key].append((where, message))
    groups = []
    for key in order:
        code, severity, blocking, shared = key
        found = members[key]
        message = found[0][1] if len(found) == 1 else shared
        groups.append(HazardGroup(code, severity, message, tuple(dict.fromkeys(where for where, _ in found)), blocking))
    return groups


def group_hazard_dicts(hazards: Iterable[dict]) -> list[HazardGroup]:
    """Groups of stored hazards (dicts with code, severity, message, optional layer and blocking), as a version
    records them."""
    return group_hazards(
        (h.get("layer"), h["code"], h["severity"], h.get("message", ""), bool(h.get("blocking"))) for h in hazards
    )


__all__ = ["HazardGroup", "elided_layers", "group_hazard_dicts", "group_hazards"]
