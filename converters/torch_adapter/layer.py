"""PyTorch LayerNorm <-> NormSpec(kind="layer") over trailing axes; ChannelsFirstLayerNorm <-> one over the channel axis
(layout="channels_first", channels_first_layer_norm.py)."""

from __future__ import annotations

import torch

from schemas import LayerReport, NormSpec

from .. import markers
from ..adapter import KindAdapter
from .state_slots import TorchRestating
from ..options import ConversionOptions
from ..translate import record_eps, tensor_fate
from .channels_first_layer_norm import ChannelsFirstLayerNorm
from .common import (
    SPEC_TO_TORCH,
    STOCK_HOLDS,
    affine_kwargs,
    check_compute_dtype,
    extended_fields,
    finish,
    layer_name,
    read_affine,
    source,
    spec_dtype,
    write_affine,
)


class TorchLayerAdapter(TorchRestating, KindAdapter):
    framework = "torch"
    kind = "layer"
    #: layout: channels_first as a ChannelsFirstLayerNorm (the channels moved last around a LayerNorm).
    holds = STOCK_HOLDS | {"layout"}
    restatable = True  # from_spec: the configuration, then the tensors through write_tensor (TorchRestating.restate)

    def to_spec(self, obj: torch.nn.LayerNorm, report: LayerReport) -> NormSpec:
        name = layer_name(obj, "LayerNorm")
        scale, bias, tensors = read_affine(obj, name, report)
        dtype = spec_dtype(obj, name, report)
        channels_first = isinstance(obj, ChannelsFirstLayerNorm)
        return NormSpec(
            **extended_fields(obj, dtype),
            name=name,
            kind="layer",
            normalized_shape=tuple(obj.normalized_shape),
            layout="channels_first" if channels_first else None,
            input_rank=markers.recall(obj).get("input_rank"),
            eps=float(obj.eps),
            scale=scale,
            bias=bias,
            training=bool(obj.training),
            dtype=dtype,
            source=source(obj),
            tensors=tensors,
        )

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> torch.nn.LayerNorm:
        check_compute_dtype(spec)
        record_eps(report, spec)
        report.add("normalized_shape", list(spec.normalized_shape))
        cls = torch.nn.LayerNorm
        if spec.layout == "channels_first":
            cls = ChannelsFirstLayerNorm
            report.add(
                "layout",
                "channels_first",
                "ChannelsFirstLayerNorm",
                "exact",
                "movedim(1, -1), LayerNorm over the channels, movedim(-1, 1), as transformers' ConvNextLayerNorm",
            )
        module = cls(
            spec.normalized_shape,
            eps=spec.eps,
            dtype=SPEC_TO_TORCH[spec.dtype],
            **affine_kwargs(spec, "elementwise_affine"),
        )
        write_affine(module, spec, report)
        tensor_fate(report, spec)
        if spec.input_rank is not None:
            markers.remember(module, input_rank=spec.input_rank)
        return finish(module, spec, report)


ADAPTER = TorchLayerAdapter
