"""toynp.LayerNorm <-> NormSpec(kind="layer")."""

from __future__ import annotations

from converters.adapter import KindAdapter
from schemas import NormSpec

from .common import require_float32, source


class ToyLayerNorm(KindAdapter):
    framework = "toynp"
    kind = "layer"

    def to_spec(self, obj, report) -> NormSpec:
        tensors = {name: array for name, array in (("scale", obj.weight), ("bias", obj.bias)) if array is not None}
        return NormSpec(
            name=obj.name,
            kind="layer",
            normalized_shape=obj.shape,
            eps=obj.eps,
            scale=obj.weight is not None,
            bias=obj.bias is not None,
            training=obj.training,
            source=source(obj),
            tensors=tensors,
        )

    def from_spec(self, spec, options, report):
        import toynp

        require_float32(spec)
        report.add("eps", spec.eps)
        return toynp.LayerNorm(
            spec.normalized_shape,
            eps=spec.eps,
            weight=spec.tensors.get("scale"),
            bias=spec.tensors.get("bias"),
            name=spec.name,
            training=spec.training,
        )


ADAPTER = ToyLayerNorm
