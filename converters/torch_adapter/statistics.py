"""BatchNorm input statistics of PyTorch models (drift and recalibration read them here).

The layer inputs are read without changing the model: forward pre-hooks on the BatchNorm
modules of a deep copy (nn.Module), or an FX interpreter over the program (ExportedProgram).
Recalibration (recalibration.py) writes each layer's population statistics, measured in eval
mode with the layers upstream already on their new ones (converters/recalibration_waves.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from schemas import InputFileError, NormbridgeError
from schemas.kinds import KIND_INFO

from ..model_values import LayerMoments, first_line
from . import torch_internals

BATCH = KIND_INFO["batch"]


def _tensors(batch) -> list[torch.Tensor]:
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in batch]


def batchnorm_modules(module: torch.nn.Module) -> list[tuple[str, Any]]:
    """(path, module) of every BatchNorm with running statistics."""
    return [
        (name or type(m).__name__, m)
        for name, m in module.named_modules()
        if isinstance(m, torch_internals.batch_norm_base_classes()) and m.running_mean is not None
    ]


def _tracked(counter) -> int | None:
    """num_batches_tracked as an int (None when the layer keeps no counter)."""
    return None if counter is None else int(counter.reshape(-1)[0].item()) if counter.numel() else None


def _momentum(value) -> float | None:
    """A program's momentum argument: 0.0 is what an eval export of momentum=None (a cumulative average) records."""
    return float(value) if isinstance(value, (int, float)) and 0.0 < float(value) < 1.0 else None


def module_moments(module: torch.nn.Module, batches: Iterable[Sequence[np.ndarray]]) -> list[LayerMoments]:
    """BatchNorm inputs of an nn.Module, read by forward pre-hooks on a deep copy in eval mode."""
    served = copy.deepcopy(module).eval()
    layers = batchnorm_modules(served)
    moments = [
        LayerMoments(
            name,
            m.running_mean.detach().double().numpy().copy(),
            m.running_var.detach().double().numpy().copy(),
            float(m.eps),
            batches_tracked=_tracked(m.num_batches_tracked),
            momentum=m.momentum,
        )
        for name, m in layers
    ]
    handles = []
    for record, (_, bn) in zip(moments, layers):
        handles.append(
            bn.register_forward_pre_hook(lambda _m, args, record=record: record.add(args[0].detach().numpy(), 1))
        )
    try:
        with torch.no_grad():
            for batch in batches:
                try:
                    served(*_tensors(batch))
                except (ValueError, RuntimeError) as error:
                    raise InputFileError(
                        f"the model refused a batch of shape {[list(a.shape) for a in batch]} ({first_line(error)})."
                    ) from error
    finally:
        for handle in handles:
            handle.remove()
    return moments


def program_moments(program, batches: Iterable[Sequence[np.ndarray]], train: bool = False) -> list[LayerMoments]:
    """BatchNorm inputs of an ExportedProgram, read by an FX interpreter over `program.module()`.

    Layers are named after their running_mean buffer ('features.1.running_mean' -> 'features.1').
    With `train`, each BatchNorm normalizes with its batch statistics (what a PyTorch
    recalibration forward computes) and the running buffers are left alone.
    """
    from torch.fx.operator_schemas import normalize_function

    module = program.module()
    buffer_names = {id(t): name for name, t in module.named_buffers()}
    tracked = {name: t for name, t in module.named_buffers() if name.endswith("num_batches_tracked")}
    moments: dict[str, LayerMoments] = {}

    class Recorder(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            if torch_internals.op_name(target) not in BATCH.aten_ops:
                return super().call_function(target, args, kwargs)
            bound = normalize_function(target, args, kwargs, normalize_to_only_use_kwargs=True).kwargs
            running_mean, running_var = bound.get("running_mean"), bound.get("running_var")
            if running_mean is None:
                return super().call_function(target, args, kwargs)
            name = buffer_names.get(id(running_mean), f"batch_norm_{len(moments)}").removesuffix(".running_mean")
            if name not in moments:
                moments[name] = LayerMoments(
                    name,
                    running_mean.double().numpy().copy(),
                    running_var.double().numpy().copy(),
                    float(bound["eps"]),
                    batches_tracked=_tracked(tracked.get(f"{name}.num_batches_tracked")),
                    momentum=_momentum(bound.get("momentum")),
                )
            moments[name].add(bound["input"].numpy(), 1)
            if not train:
                return super().call_function(target, args, kwargs)
            out = F.batch_norm(
                bound["input"],
                None,
                None,
                bound.get("weight"),
                bound.get("bias"),
                training=True,
                momentum=0.0,
                eps=bound["eps"],
            )
            extra = len(torch_internals.op_schema(target).returns) - 1
            return out if extra == 0 else (out,) + tuple(torch.empty(0) for _ in range(extra))

    recorder = Recorder(module)
    with torch.no_grad():
        for batch in batches:
            try:
                recorder.run(*_tensors(batch))
            except NormbridgeError:
                raise
            except Exception as error:  # guards of a fixed-shape program, a batch of one in train mode, ...
                raise InputFileError(
                    f"the ExportedProgram refused a batch of shape {[list(a.shape) for a in batch]} ({type(error).__name__}: {first_line(error)})."
                ) from error
    return list(moments.values())
