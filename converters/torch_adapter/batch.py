"""PyTorch BatchNorm{1,2,3}d <-> NormSpec(kind="batch")."""

from __future__ import annotations

import torch

from schemas import LayerReport, NormSpec

from ..adapter import KindAdapter
from .state_slots import TorchRestating
from ..options import ConversionOptions
from .common import STOCK_HOLDS
from .running_stats import build_norm_base, read_norm_base

BATCH_CLASSES = {1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}


def spatial_rank_of(module: torch.nn.Module, classes: dict) -> int:
    for rank, cls in classes.items():
        if isinstance(module, cls):
            return rank
    raise TypeError(type(module))


class TorchBatchAdapter(TorchRestating, KindAdapter):
    framework = "torch"
    kind = "batch"
    holds = STOCK_HOLDS | {"frozen", "synchronized"}
    restatable = True  # from_spec: the configuration, then the tensors through write_tensor (TorchRestating.restate)

    def to_spec(self, obj: torch.nn.Module, report: LayerReport) -> NormSpec:
        return read_norm_base(obj, "batch", spatial_rank_of(obj, BATCH_CLASSES), report)

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> torch.nn.Module:
        return build_norm_base(spec, BATCH_CLASSES, options, report)


ADAPTER = TorchBatchAdapter
