"""PyTorch GroupNorm <-> NormSpec(kind="group"); channels-first, per-channel affine."""

from __future__ import annotations

import torch

from schemas import LayerReport, NormSpec

from .. import markers
from ..adapter import KindAdapter
from .state_slots import TorchRestating
from ..options import ConversionOptions
from ..translate import record_eps, record_layout, tensor_fate
from .layouts import remember_layout, remembered_layout
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


class TorchGroupAdapter(TorchRestating, KindAdapter):
    framework = "torch"
    kind = "group"
    holds = STOCK_HOLDS
    restatable = True  # from_spec: the configuration, then the tensors through write_tensor (TorchRestating.restate)

    def to_spec(self, obj: torch.nn.GroupNorm, report: LayerReport) -> NormSpec:
        name = layer_name(obj, "GroupNorm")
        scale, bias, tensors = read_affine(obj, name, report)
        dtype = spec_dtype(obj, name, report)
        return NormSpec(
            **extended_fields(obj, dtype),
            name=name,
            kind="group",
            num_features=obj.num_channels,
            num_groups=obj.num_groups,
            input_rank=markers.recall(obj).get("input_rank"),
            layout="channels_first",
            chosen_layout=remembered_layout(markers.recall(obj)),
            eps=float(obj.eps),
            scale=scale,
            bias=bias,
            training=bool(obj.training),
            dtype=dtype,
            source=source(obj),
            tensors=tensors,
        )

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> torch.nn.GroupNorm:
        check_compute_dtype(spec)
        record_layout(report, spec, "channels_first")
        record_eps(report, spec)
        report.add("num_groups", spec.num_groups)
        module = torch.nn.GroupNorm(
            spec.num_groups, spec.num_features, eps=spec.eps, dtype=SPEC_TO_TORCH[spec.dtype], **affine_kwargs(spec)
        )
        write_affine(module, spec, report)
        tensor_fate(report, spec)
        if spec.input_rank is not None:
            markers.remember(module, input_rank=spec.input_rank)
        remember_layout(module, spec, report)
        return finish(module, spec, report)


ADAPTER = TorchGroupAdapter
