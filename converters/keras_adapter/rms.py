"""RMSNormalization <-> rms spec: x / sqrt(mean(x^2) + eps) * scale over the trailing axes."""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas import LayerReport, NormSpec
from schemas.kinds import KIND_INFO

from .. import markers
from ..options import ConversionOptions
from .facts import STORED_NOTE, read_facts
from .kind_adapter import KerasKindAdapter
from .probed import is_stock, probed_spec
from .runtime import import_keras
from .shapes import build_rank, built_input_shape, trailing_axes, trailing_axis_argument, trailing_shape
from .variables import assign_variable, read_variable, variable_dtype

#: RMSNormalization keeps its weight in the attribute `scale` (a variable, not a flag).
VARIABLES = {"scale": "scale"}


class KerasRmsAdapter(KerasKindAdapter):
    """keras.layers.RMSNormalization <-> kind "rms" (never a bias)."""

    kind = "rms"
    layer_classes = KIND_INFO["rms"].classes["keras"]
    restatable = True  # from_spec: configuration, then finish_emit writes the tensors (KerasKindAdapter.restate)

    def to_spec(self, obj: Any, report: LayerReport) -> NormSpec:
        if not is_stock(obj, self.layer_classes):  # a custom layer (keras_hub's): what the probe proved
            return probed_spec(obj, self.kind, report)
        layer = self.layer_of(obj)
        shape = built_input_shape(layer)
        trailing_axes(layer, layer.axis, len(shape))
        weight = read_variable(layer.scale)
        tensors = {"scale": weight}
        if "scale" in markers.recall(layer).get("frozen_identity", ()):
            # Emitted from a scale-less spec as frozen ones; it still is one only if unchanged.
            if not layer.trainable and bool(np.all(weight == 1)):
                tensors = {}
            else:
                report.warn(
                    "the scale was emitted as frozen ones but has since changed or been unfrozen; it is read as a learned scale."
                )
        return read_facts(layer, report).spec(
            layer,
            "rms",
            tensors,
            normalized_shape=tuple(int(d) for d in weight.shape),
            input_rank=len(shape),
            scale=bool(tensors),
            bias=False,
        )

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> Any:
        common = self.begin_emit(spec, report)
        count = len(spec.normalized_shape)
        layer = import_keras().layers.RMSNormalization(axis=trailing_axis_argument(count), **common)
        rank = build_rank(spec, report, count + 2, fixes_rank=False)
        self.finish_emit(layer, spec, report, trailing_shape(spec.normalized_shape, rank), VARIABLES)
        if not spec.scale:
            # Keras RMSNormalization always multiplies by its scale weight: ones, frozen, is the identity.
            assign_variable(layer, "scale", np.ones(spec.normalized_shape, dtype=variable_dtype(spec)), "scale")
            layer.trainable = False
            markers.remember(layer, frozen_identity=("scale",))
            report.add(
                "scale",
                False,
                "frozen scale = 1",
                "stored",
                "Keras RMSNormalization always has a scale weight; " + STORED_NOTE,
            )
        return layer


ADAPTER = KerasRmsAdapter
