"""Keras layers that look like normalizations: what the probe is asked about,
and what is reported when it proves nothing.

A layer looks like one when its class name contains "Norm" or it has a gamma or beta variable
shaped like its last input axis, and it is neither a stock normalization class nor a composite
(a layer with sublayers: those are walked themselves).
"""

from __future__ import annotations

from typing import Any

from schemas.kinds import KIND_INFO

from .keras_internals import has_sublayers
from .runtime import import_keras

#: Stock classes that are not a normalizer kind but are judged elsewhere (keras_adapter/standardization.py).
OTHER_STOCK = ("Normalization",)
#: Variable names that mark a normalization's affine weights.
AFFINE_MARKS = frozenset({"gamma", "beta"})


def stock_classes() -> tuple[type, ...]:
    layers = import_keras().layers
    names = {name for info in KIND_INFO.values() for name in info.stock_classes("keras")} | set(OTHER_STOCK)
    return tuple(getattr(layers, name) for name in sorted(names) if hasattr(layers, name))


def looks_like_normalization(layer: Any) -> str | None:
    """Why `layer` looks like a normalization (one phrase), or None."""
    if isinstance(layer, stock_classes()) or has_sublayers(layer):
        return None
    name = type(layer).__name__
    if "norm" in name.lower():
        return f"its class name {name} contains 'Norm'"
    marked = [
        v for v in getattr(layer, "weights", []) if v.path.rsplit("/", 1)[-1] in AFFINE_MARKS and len(v.shape) == 1
    ]
    if marked:
        return (
            f"it has {'/'.join(v.path.rsplit('/', 1)[-1] for v in marked)} variables of shape {list(marked[0].shape)}"
        )
    return None
