"""Recognising and running PyTorch normalization modules."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from schemas import UnsupportedObjectError

from .. import recognizers
from ..adapter import FrameworkAdapter


class TorchFramework(FrameworkAdapter):
    name = "torch"

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, torch.nn.Module) and super().owns(obj)

    def kind_of(self, obj: Any) -> str:
        """The kind the torch recognizers read (converters/recognizers/: the stock modules first)."""
        kind = recognizers.kind_of("torch", obj)
        if kind is None:
            from ..recognizers.torch_modules import SUPPORTED

            raise UnsupportedObjectError(f"got a torch {type(obj).__name__}, expected one of {SUPPORTED}.")
        return kind

    def recognised_spec(self, obj: Any):
        """The proved spec of a module no stock class covers (torch_adapter/computed.py), else None."""
        from .computed import recognition

        found = recognition(obj)
        return None if found is None else found.spec

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
