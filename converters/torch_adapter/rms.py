"""PyTorch RMSNorm <-> NormSpec(kind="rms"), including eps=None (the eps of the dtype torch computes in)."""

from __future__ import annotations

import torch

from schemas import LayerReport, NormSpec
from schemas.floats import dtype_default_eps

from .. import markers
from ..adapter import KindAdapter
from .state_slots import TorchRestating
from ..options import ConversionOptions
from ..translate import record_eps, tensor_fate
from .common import (
    SPEC_TO_TORCH,
    STOCK_HOLDS,
    check_compute_dtype,
    extended_fields,
    finish,
    layer_name,
    read_affine,
    source,
    spec_dtype,
    write_affine,
)


class TorchRmsAdapter(TorchRestating, KindAdapter):
    framework = "torch"
    kind = "rms"
    holds = STOCK_HOLDS
    restatable = True  # from_spec: the configuration, then the tensors through write_tensor (TorchRestating.restate)

    def to_spec(self, obj: torch.nn.RMSNorm, report: LayerReport) -> NormSpec:
        name = layer_name(obj, "RMSNorm")
        scale, _, tensors = read_affine(obj, name, report)
        dtype = spec_dtype(obj, name, report)
        if obj.eps is None:
            # Note [RMSNorm eps=None]: PyTorch then uses the eps of the dtype it computes in (float32 for a 16-bit
            # layer, schemas.floats.dtype_default_eps); store the number and where it came from.
            eps, origin = dtype_default_eps(dtype), "dtype_eps"
            report.add(
                "eps",
                None,
                eps,
                "translated",
                f"eps=None means the eps of the dtype torch computes a {dtype} RMSNorm in",
            )
        else:
            eps, origin = float(obj.eps), "explicit"
        return NormSpec(
            **extended_fields(obj, dtype),
            name=name,
            kind="rms",
            normalized_shape=tuple(obj.normalized_shape),
            input_rank=markers.recall(obj).get("input_rank"),
            eps=eps,
            eps_origin=origin,
            scale=scale,
            bias=False,
            training=bool(obj.training),
            dtype=dtype,
            source=source(obj),
            tensors=tensors,
        )

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> torch.nn.RMSNorm:
        check_compute_dtype(spec)
        dtype = SPEC_TO_TORCH[spec.dtype]
        eps = spec.eps
        if spec.eps_origin == "dtype_eps" and spec.eps == dtype_default_eps(spec.dtype):
            eps = None
            report.add(
                "eps", spec.eps, None, "translated", "written as eps=None, which PyTorch resolves to the same eps"
            )
        else:
            record_eps(report, spec)
        report.add("normalized_shape", list(spec.normalized_shape))
        module = torch.nn.RMSNorm(spec.normalized_shape, eps=eps, elementwise_affine=spec.scale, dtype=dtype)
        write_affine(module, spec, report)
        tensor_fate(report, spec)
        if spec.input_rank is not None:
            markers.remember(module, input_rank=spec.input_rank)
        return finish(module, spec, report)


ADAPTER = TorchRmsAdapter
