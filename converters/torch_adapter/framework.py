"""Recognising and running PyTorch normalization modules."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from schemas import UnsupportedObjectError

from ..adapter import FrameworkAdapter

#: Checked in order: the first matching class decides the kind.
KIND_CLASSES: tuple[tuple[type, str], ...] = (
    (torch.nn.modules.batchnorm._BatchNorm, "batch"),
    (torch.nn.modules.instancenorm._InstanceNorm, "instance"),
    (torch.nn.GroupNorm, "group"),
    (torch.nn.LayerNorm, "layer"),
    (torch.nn.RMSNorm, "rms"),
)
SUPPORTED = "BatchNorm1d/2d/3d, InstanceNorm1d/2d/3d, GroupNorm, LayerNorm or RMSNorm"


class TorchFramework(FrameworkAdapter):
    name = "torch"

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, torch.nn.Module) and super().owns(obj)

    def kind_of(self, obj: Any) -> str:
        if isinstance(obj, (torch.nn.SyncBatchNorm, torch.nn.modules.lazy.LazyModuleMixin)):
            raise UnsupportedObjectError(
                f"got a {type(obj).__name__}, whose spatial rank or size is not fixed; convert it to BatchNorm{{1,2,3}}d (or materialise it) first."
            )
        for cls, kind in KIND_CLASSES:
            if isinstance(obj, cls):
                if kind in ("batch", "instance") and not isinstance(obj, _fixed_rank_classes(kind)):
                    break
                return kind
        raise UnsupportedObjectError(f"got a torch {type(obj).__name__}, expected one of {SUPPORTED}.")

    def version(self) -> str:
        return torch.__version__.split("+")[0]

    def natural_layout(self) -> str:
        return "channels_first"

    def run_eval(self, obj: torch.nn.Module, x: np.ndarray) -> np.ndarray:
        module = copy.deepcopy(obj).eval()
        with torch.no_grad():
            return module(torch.from_numpy(np.ascontiguousarray(x))).numpy()

    def run_train_step(self, obj: torch.nn.Module, x: np.ndarray):
        module = copy.deepcopy(obj).train()
        with torch.no_grad():
            y = module(torch.from_numpy(np.ascontiguousarray(x))).numpy()
        if getattr(module, "track_running_stats", False) and getattr(module, "running_mean", None) is not None:
            return y, module.running_mean.numpy().copy(), module.running_var.numpy().copy()
        return y, None, None


def _fixed_rank_classes(kind: str) -> tuple[type, ...]:
    from .batch import BATCH_CLASSES
    from .instance import INSTANCE_CLASSES

    return tuple((BATCH_CLASSES if kind == "batch" else INSTANCE_CLASSES).values())
