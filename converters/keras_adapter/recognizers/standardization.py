"""keras.layers.Normalization (a frozen standardisation): known, and refused as a layer with the reason
(keras_adapter/standardization.py).

Raising here, rather than returning None, keeps later recognizers (the behavioural probe) from
guessing at it; the Keras model adapter lists it with its statistics instead.
"""

from __future__ import annotations

from typing import Any

from schemas import UnsupportedObjectError

from ...adapter import owning_framework
from ...recognizers.base import ObjectRecognizer
from ..standardization import is_standardization, refusal


class KerasStandardization(ObjectRecognizer):
    """keras.layers.Normalization: an UnsupportedObjectError naming the layer and why it is not converted."""

    name = "keras.standardization"
    framework = "keras"

    def kind_of(self, obj: Any) -> str | None:
        if owning_framework(obj, ("keras",)) != "keras" or not is_standardization(obj):
            return None
        raise UnsupportedObjectError(refusal(obj), layer=getattr(obj, "name", None), setting="kind")


RECOGNIZER = KerasStandardization()
