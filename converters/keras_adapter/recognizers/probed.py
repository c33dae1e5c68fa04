"""Custom Keras normalization layers (keras_hub's RMSNormalization, LlamaLayerNorm, T5LayerNorm, a user's own),
by a behavioural probe.

Only layers that look like a normalization (keras_adapter/lookalike.py) are probed; the probe
(keras_adapter/probe.py) calls the layer, recovers kind, axes, eps and affine factor, and proves
them against the NumPy reference. A layer it cannot prove is not recognised here; the Keras model
adapter reports it as an `unrecognised_normalization` hazard.
"""

from __future__ import annotations

from typing import Any

from ...adapter import owning_framework
from ...recognizers.base import ObjectRecognizer
from ..lookalike import looks_like_normalization
from ..probe import probe_layer


class KerasProbedLayers(ObjectRecognizer):
    """A custom Keras layer the probe proves to compute layer or RMS normalization."""

    name = "keras.probed"
    framework = "keras"

    def kind_of(self, obj: Any) -> str | None:
        if (
            owning_framework(obj, ("keras",)) != "keras"
            or not hasattr(obj, "weights")
            or looks_like_normalization(obj) is None
        ):
            return None
        norm = probe_layer(obj).norm
        return None if norm is None else norm.kind


RECOGNIZER = KerasProbedLayers()
