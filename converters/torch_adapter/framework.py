"""Recognising and running PyTorch normalization modules."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from schemas import NotExpressibleError, UnsupportedObjectError

from .. import markers, recognizers
from ..adapter import FrameworkAdapter
from . import torch_internals
from .common import numpy_from_tensor, tensor_from_numpy


_THREADS = threading.Lock()
_probing = 0  # probes running now, in any thread
_saved_threads = 0  # torch's intra-op thread count before the first of them


@contextmanager
def one_thread() -> Iterator[None]:
    """Run a probe on one intra-op thread (as onnx_adapter/framework.py does for onnxruntime).

    A probe holds a few thousand values, far too few to gain from worker threads; with OpenMP's workers
    spinning beside TensorFlow's or another process's on a shared machine, a 4x64x5x4 batch_norm took
    16 ms instead of 0.02 ms (measured on 2 cores). torch's setting is process-wide, so the first probe
    sets it and the last one restores it.
    """
    global _probing, _saved_threads
    with _THREADS:
        if _probing == 0:
            _saved_threads = torch.get_num_threads()
            torch.set_num_threads(1)
        _probing += 1
    try:
        yield
    finally:
        with _THREADS:
            _probing -= 1
            if _probing == 0:
                torch.set_num_threads(_saved_threads)


class TorchFramework(FrameworkAdapter):
    name = "torch"

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, torch.nn.Module) and super().owns(obj)

    def kind_of(self, obj: Any) -> str:
        """The kind the torch recognizers read (recognizers/: the stock modules first)."""
        kind = recognizers.kind_of("torch", obj)
        if kind is None:
            from .recognizers.modules import SUPPORTED
            from .recognition.computed import recognition
            from .recognition.norm_hazards import unrecognised

            found = recognition(obj)  # a candidate whose proof failed says why, in inspect's words
            why = (
                ""
                if found is None or found.reason is None
                else " "
                + unrecognised(type(obj).__name__, type(obj).__name__, found.why_candidate, found.reason).message
            )
            raise UnsupportedObjectError(f"got a torch {type(obj).__name__}, expected one of {SUPPORTED}.{why}")
        return kind

    def recognised_spec(self, obj: Any):
        """The proved spec of a module no stock class covers (recognition/computed.py), else None."""
        from .recognition.computed import recognition

        found = recognition(obj)
        return None if found is None else found.spec

    def restore(self, spec):
        """The class a recognised spec was read from (LlamaRMSNorm), rebuilt and proved equal (restoring.py),
        else (None, why)."""
        from .restoring import restore_class  # restoring imports the recognizer, as recognised_spec does

        return restore_class(spec)

    def version(self) -> str:
        return torch_internals.torch_version()

    def natural_layout(self) -> str:
        return "channels_first"

    def run_eval(self, obj: torch.nn.Module, x: np.ndarray, in_place: bool = False) -> np.ndarray:
        module = (obj if in_place else copy.deepcopy(obj)).eval()
        with torch.no_grad(), one_thread():
            return numpy_from_tensor(module(tensor_from_numpy(np.asarray(x))))

    def run_train_step(self, obj: torch.nn.Module, x: np.ndarray, in_place: bool = False):
        if markers.recall(obj).get("frozen") is True:
            raise NotExpressibleError(
                "this stock module holds frozen statistics for eval only (momentum 0): its training-mode forward uses batch statistics, "
                "which the frozen layer never does; train the source layer instead.",
                layer=markers.recall(obj).get("name"),
                setting="frozen",
                target="torch",
            )
        module = (obj if in_place else copy.deepcopy(obj)).train()
        with torch.no_grad(), one_thread():
            y = numpy_from_tensor(module(tensor_from_numpy(np.asarray(x))))
        if getattr(module, "track_running_stats", False) and getattr(module, "running_mean", None) is not None:
            return y, numpy_from_tensor(module.running_mean).copy(), numpy_from_tensor(module.running_var).copy()
        return y, None, None
