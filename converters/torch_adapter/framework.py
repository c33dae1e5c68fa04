"""Recognising and running PyTorch normalization modules."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from schemas import UnsupportedObjectError
from schemas.kinds import KIND_INFO

from ..adapter import FrameworkAdapter

#: Checked in order: the first kind one of whose stock classes `obj` is an instance of decides.
KIND_CLASSES: tuple[tuple[tuple[type, ...], str], ...] = tuple(
    (tuple(getattr(torch.nn, name) for name in info.classes["torch"]), kind) for kind, info in KIND_INFO.items()
)


def _class_names(names: tuple[str, ...]) -> str:
    """'BatchNorm1d/2d/3d' for the three ranks of one class, else the names joined by '/'."""
    if len(names) > 1 and all(n[:-2] == names[0][:-2] and n[-1] == "d" for n in names):
        return names[0] + "/" + "/".join(n[-2:] for n in names[1:])
    return "/".join(names)


_NAMES = [_class_names(info.classes["torch"]) for info in KIND_INFO.values()]
SUPPORTED = ", ".join(_NAMES[:-1]) + " or " + _NAMES[-1]


class TorchFramework(FrameworkAdapter):
    name = "torch"

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, torch.nn.Module) and super().owns(obj)

    def kind_of(self, obj: Any) -> str:
        if isinstance(obj, (torch.nn.SyncBatchNorm, torch.nn.modules.lazy.LazyModuleMixin)):
            raise UnsupportedObjectError(
                f"got a {type(obj).__name__}, whose spatial rank or size is not fixed; convert it to BatchNorm{{1,2,3}}d (or materialise it) first."
            )
        for classes, kind in KIND_CLASSES:
            if isinstance(obj, classes):
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
