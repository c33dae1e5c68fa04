"""PyTorch InstanceNorm{1,2,3}d <-> NormSpec(kind="instance"), with or without tracked statistics."""

from __future__ import annotations

import torch

from schemas import LayerReport, NormSpec

from ..adapter import KindAdapter
from .state_slots import TorchRestating
from ..options import ConversionOptions
from .batch import spatial_rank_of
from .common import STOCK_HOLDS
from .running_stats import build_norm_base, read_norm_base

INSTANCE_CLASSES = {1: torch.nn.InstanceNorm1d, 2: torch.nn.InstanceNorm2d, 3: torch.nn.InstanceNorm3d}


class TorchInstanceAdapter(TorchRestating, KindAdapter):
    framework = "torch"
    kind = "instance"
    holds = STOCK_HOLDS | {"frozen"}
    restatable = True  # from_spec: the configuration, then the tensors through write_tensor (TorchRestating.restate)

    def to_spec(self, obj: torch.nn.Module, report: LayerReport) -> NormSpec:
        return read_norm_base(obj, "instance", spatial_rank_of(obj, INSTANCE_CLASSES), report)

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> torch.nn.Module:
        return build_norm_base(spec, INSTANCE_CLASSES, options, report)


ADAPTER = TorchInstanceAdapter
