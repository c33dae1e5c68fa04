"""toynp.ScaleNorm <-> NormSpec(kind="scalenorm"), the toy kind."""

from __future__ import annotations

from converters.adapter import KindAdapter
from schemas import NormSpec

from .common import require_float32, source


class ToyScaleNorm(KindAdapter):
    framework = "toynp"
    kind = "scalenorm"

    def to_spec(self, obj, report) -> NormSpec:
        tensors = {} if obj.weight is None else {"scale": obj.weight}
        return NormSpec(
            name=obj.name,
            kind="scalenorm",
            normalized_shape=(obj.size,),
            eps=obj.eps,
            scale=obj.weight is not None,
            bias=False,
            training=obj.training,
            source=source(obj),
            tensors=tensors,
        )

    def from_spec(self, spec, options, report):
        import toynp

        require_float32(spec)
        report.add("eps", spec.eps)
        return toynp.ScaleNorm(
            spec.normalized_shape[0],
            eps=spec.eps,
            weight=spec.tensors.get("scale"),
            name=spec.name,
            training=spec.training,
        )


ADAPTER = ToyScaleNorm
