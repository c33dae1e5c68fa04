"""BatchNorm input statistics of PyTorch models, and recalibrating their running statistics.

The layer inputs are read without changing the model: forward pre-hooks on the BatchNorm
modules of a deep copy (nn.Module), or an FX interpreter over the program (ExportedProgram).
Recalibration is PyTorch's own cumulative average (momentum=None) for a module; for a program,
the averages of the recorded batch moments, rounded once into a copy of its state dict.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from schemas import InputFileError, NormbridgeError, UnsupportedObjectError
from schemas.kinds import KIND_INFO

from ..model_values import LayerMoments, Movement, cumulative_statistics, first_line

BATCH = KIND_INFO["batch"]


def _tensors(batch) -> list[torch.Tensor]:
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in batch]


def batchnorm_modules(module: torch.nn.Module) -> list[tuple[str, Any]]:
    """(path, module) of every BatchNorm with running statistics."""
    return [(name or type(m).__name__, m) for name, m in module.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None]


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
    moments = [LayerMoments(name, m.running_mean.detach().double().numpy().copy(), m.running_var.detach().double().numpy().copy(), float(m.eps),
                            batches_tracked=_tracked(m.num_batches_tracked), momentum=m.momentum) for name, m in layers]
    handles = []
    for record, (_, bn) in zip(moments, layers):
        handles.append(bn.register_forward_pre_hook(lambda _m, args, record=record: record.add(args[0].detach().numpy(), 1)))
    try:
        with torch.no_grad():
            for batch in batches:
                try:
                    served(*_tensors(batch))
                except (ValueError, RuntimeError) as error:
                    raise InputFileError(f"the model refused a batch of shape {[list(a.shape) for a in batch]} ({first_line(error)}).") from error
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
            schema = getattr(target, "_schema", None)
            if schema is None or schema.name not in BATCH.aten_ops:
                return super().call_function(target, args, kwargs)
            bound = normalize_function(target, args, kwargs, normalize_to_only_use_kwargs=True).kwargs
            running_mean, running_var = bound.get("running_mean"), bound.get("running_var")
            if running_mean is None:
                return super().call_function(target, args, kwargs)
            name = buffer_names.get(id(running_mean), f"batch_norm_{len(moments)}").removesuffix(".running_mean")
            if name not in moments:
                moments[name] = LayerMoments(name, running_mean.double().numpy().copy(), running_var.double().numpy().copy(), float(bound["eps"]),
                                             batches_tracked=_tracked(tracked.get(f"{name}.num_batches_tracked")),
                                             momentum=_momentum(bound.get("momentum")))
            moments[name].add(bound["input"].numpy(), 1)
            if not train:
                return super().call_function(target, args, kwargs)
            out = F.batch_norm(bound["input"], None, None, bound.get("weight"), bound.get("bias"), training=True, momentum=0.0, eps=bound["eps"])
            extra = len(schema.returns) - 1
            return out if extra == 0 else (out,) + tuple(torch.empty(0) for _ in range(extra))

    recorder = Recorder(module)
    with torch.no_grad():
        for batch in batches:
            try:
                recorder.run(*_tensors(batch))
            except NormbridgeError:
                raise
            except Exception as error:  # guards of a fixed-shape program, a batch of one in train mode, ...
                raise InputFileError(f"the ExportedProgram refused a batch of shape {[list(a.shape) for a in batch]} ({type(error).__name__}: {first_line(error)}).") from error
    return list(moments.values())


def recalibrate_module(module: torch.nn.Module, batches: list[tuple[np.ndarray, ...]]) -> tuple[torch.nn.Module, list[Movement], str]:
    """PyTorch's own cumulative average: train-mode forwards of a deep copy with reset statistics and momentum=None."""
    new = copy.deepcopy(module)
    modes = {name: m.training for name, m in new.named_modules()}
    layers = batchnorm_modules(new)
    before = {name: (bn.running_mean.detach().clone(), bn.running_var.detach().clone()) for name, bn in layers}
    momenta = {}
    new.eval()
    for name, bn in layers:
        momenta[name] = bn.momentum
        bn.reset_running_stats()
        bn.momentum = None
        bn.train()
    try:
        with torch.no_grad():
            for batch in batches:
                try:
                    new(*_tensors(batch))
                except (ValueError, RuntimeError) as error:  # e.g. one value per channel in train mode
                    raise InputFileError(f"the model refused a recalibration batch of shape {[list(a.shape) for a in batch]} ({first_line(error)}).") from error
    finally:
        for name, bn in layers:
            bn.momentum = momenta[name]
        for name, m in new.named_modules():
            m.training = modes[name]
    moved = [(name, *before[name], bn.running_mean.detach(), bn.running_var.detach(), float(bn.eps)) for name, bn in layers]
    method = ("PyTorch train-mode forwards of a deep copy with reset statistics and momentum=None (cumulative average over batches); "
              "other layers in eval mode, no gradients; momentum and modes restored")
    return new, moved, method


def recalibrate_program(program, batches: list[tuple[np.ndarray, ...]], variance_estimator: str) -> tuple[Any, list[Movement], str]:
    """The averages of the recorded batch moments in float64, rounded once to float32 into a copy of the state dict."""
    moments = program_moments(program, batches, train=True)
    new = copy.deepcopy(program)
    state = new.state_dict
    moved = []
    for record in moments:
        keys = (f"{record.name}.running_mean", f"{record.name}.running_var")
        if not all(k in state for k in keys):
            raise UnsupportedObjectError(f"layer '{record.name}': its running statistics are not buffers of the program's state dict; recalibrate the nn.Module and export again.")
        mean, var = cumulative_statistics(record, variance_estimator)
        with torch.no_grad():
            state[keys[0]].copy_(torch.from_numpy(mean).to(state[keys[0]].dtype))
            state[keys[1]].copy_(torch.from_numpy(var).to(state[keys[1]].dtype))
            tracked = f"{record.name}.num_batches_tracked"
            if tracked in state:
                state[tracked].fill_(len(batches))
        moved.append((record.name, record.running_mean, record.running_var, mean, var, record.eps))
    method = ("FX interpreter over the program with BatchNorm on batch statistics; average over batches of batch mean and "
              f"{variance_estimator} batch variance in float64, rounded once to float32 into the state dict (graph unchanged)")
    return new, moved, method
