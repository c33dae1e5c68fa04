"""LayerNormalization <-> layer spec: per-sample statistics over the trailing axes."""

from __future__ import annotations

from typing import Any

from schemas import LayerReport, NormSpec, SpecError
from schemas.kinds import KIND_INFO

from ..options import ConversionOptions
from .facts import read_facts
from .kind_adapter import KerasKindAdapter
from .probed import is_stock, probed_spec
from .runtime import import_keras
from .shapes import (
    build_rank,
    built_input_shape,
    channels_first_shape,
    normalises_channel_axis,
    trailing_axes,
    trailing_axis_argument,
    trailing_shape,
)
from .variables import AFFINE_VARIABLES, read_variables


class KerasLayerAdapter(KerasKindAdapter):
    """keras.layers.LayerNormalization <-> kind "layer"."""

    kind = "layer"
    layer_classes = KIND_INFO["layer"].classes["keras"]
    #: axis=1: the channel axis of a channels_first input (ConvNeXt's LayerNorm), as well as bf16 and mixed policies.
    holds = KerasKindAdapter.holds | {"layout"}
    restatable = True  # from_spec: configuration, then finish_emit writes the tensors (KerasKindAdapter.restate)

    def to_spec(self, obj: Any, report: LayerReport) -> NormSpec:
        if not is_stock(obj, self.layer_classes):  # a custom layer (keras_hub's): what the probe proved
            return probed_spec(obj, self.kind, report)
        layer = self.layer_of(obj)
        if getattr(layer, "rms_scaling", False):
            # keras/src/ops/nn.py: rms_scaling divides by sqrt(var + eps) without centring,
            # which is neither LayerNorm nor RMSNorm.
            raise SpecError(
                "rms_scaling=True scales by the variance (x / sqrt(var + eps) * gamma, no centring), which no PyTorch or ONNX layer computes; "
                "use keras.layers.RMSNormalization or rms_scaling=False.",
                layer=layer.name,
                setting="rms_scaling",
            )
        shape = built_input_shape(layer)
        if normalises_channel_axis(layer.axis, len(shape)):
            return read_channel_axis(
                layer, report, "layer", AFFINE_VARIABLES, shape, scale=bool(layer.scale), bias=bool(layer.center)
            )
        axes = trailing_axes(layer, layer.axis, len(shape))
        tensors = read_variables(layer, AFFINE_VARIABLES)
        normalized_shape = tuple(next(iter(tensors.values())).shape) if tensors else shape[axes[0] :]
        if any(d is None for d in normalized_shape):
            raise SpecError(
                f"the normalised axes of the built input {shape} have unknown sizes, expected known sizes; build it with the full normalised shape.",
                layer=layer.name,
                setting="normalized_shape",
            )
        return read_facts(layer, report).spec(
            layer,
            "layer",
            tensors,
            normalized_shape=tuple(int(d) for d in normalized_shape),
            input_rank=len(shape),
            scale=bool(layer.scale),
            bias=bool(layer.center),
        )

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> Any:
        common = self.begin_emit(spec, report)
        count = len(spec.normalized_shape)
        axis, shape = emit_axes(spec, report)
        layer = import_keras().layers.LayerNormalization(axis=axis, center=spec.bias, scale=spec.scale, **common)
        return self.finish_emit(layer, spec, report, shape, AFFINE_VARIABLES)


def emit_axes(spec: NormSpec, report: LayerReport) -> tuple[Any, tuple]:
    """Keras `axis=` and build shape: the trailing axes, or axis 1 of a channels_first input
    (layout set on a trailing kind)."""
    if spec.layout == "channels_first":
        report.add(
            "layout", "channels_first", "axis=1", "exact", "statistics over the channel axis of a channels_first input"
        )
        return 1, channels_first_shape(spec.normalized_shape[0], build_rank(spec, report, 4, minimum=3))
    count = len(spec.normalized_shape)
    return trailing_axis_argument(count), trailing_shape(
        spec.normalized_shape, build_rank(spec, report, count + 2, fixes_rank=False)
    )


def read_channel_axis(
    layer: Any, report: LayerReport, kind: str, variables: dict, shape: tuple, **fields: Any
) -> NormSpec:
    """A layer/rms spec over the channel axis (axis=1) of a channels_first input."""
    tensors = read_variables(layer, variables)
    channels = shape[1]
    if channels is None:
        raise SpecError(
            "the channel axis of the built input has an unknown size, expected a known one; build it with the channel count.",
            layer=layer.name,
            setting="normalized_shape",
        )
    return read_facts(layer, report).spec(
        layer,
        kind,
        tensors,
        normalized_shape=(int(channels),),
        layout="channels_first",
        input_rank=len(shape),
        **fields,
    )


ADAPTER = KerasLayerAdapter
