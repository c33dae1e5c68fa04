"""PyTorch side of porting (converters.models.porting): writing a ported spec into an existing module.

Writing goes into a module that already sits in the user's model: the module is never
replaced, its parameters and buffers are overwritten in place, bit-exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from schemas import LayerReport, NotExpressibleError

from .. import markers
from .common import assign

#: PyTorch affine parameter -> (spec flag, identity value).
_AFFINE = {"weight": ("scale", 1.0), "bias": ("bias", 0.0)}
_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


@dataclass
class TorchWrite:
    """The writes that make `target` hold what `fresh` (the converter's own module) holds."""

    target: torch.nn.Module
    steps: list[Callable[[], None]] = field(default_factory=list)


def plan_write(fresh: torch.nn.Module, target: torch.nn.Module, path: str, report: LayerReport) -> TorchWrite:
    """Check that `target` can hold `fresh`'s state and return the writes (nothing is written yet)."""
    plan = TorchWrite(target)
    frozen: list[str] = []
    frozen_before = set(markers.recall(target).get("frozen_identity", ()))
    for attr, (flag, identity) in _AFFINE.items():
        ours, theirs = getattr(fresh, attr, None), getattr(target, attr, None)
        if ours is not None and theirs is None:
            raise NotExpressibleError(
                f"the source has a {flag} but the target {type(target).__name__} has no '{attr}' parameter; rebuild the target layer with its affine parameters.",
                layer=path,
                setting=flag,
                target="torch",
            )
        if ours is not None:
            # requires_grad is the user's choice on the target; it changes only where normbridge freezes
            # an identity (the converter froze `ours`) or had frozen one that now gets real values.
            freeze = not ours.requires_grad
            plan.steps.append(
                _copy_parameter(ours, theirs, False if freeze else True if flag in frozen_before else None)
            )
            if freeze:
                frozen.append(flag)
        elif theirs is not None:
            # The source has no such parameter: the target's becomes a frozen identity, as the converter emits it.
            plan.steps.append(_fill_identity(theirs, identity))
            frozen.append(flag)
            report.add(
                flag,
                False,
                f"frozen {attr} = {identity:g}",
                "stored",
                f"the target {type(target).__name__} has a '{attr}' the source lacks; set to the identity and frozen",
            )
    for name in _BUFFERS:
        ours, theirs = getattr(fresh, name, None), getattr(target, name, None)
        if ours is None and theirs is None:
            continue
        if ours is None or theirs is None:
            raise NotExpressibleError(
                f"the source {'tracks' if ours is not None else 'does not track'} running statistics but the target {type(target).__name__} "
                f"{'does not' if theirs is None else 'does'} ('{name}'); rebuild the target layer with track_running_stats={ours is not None}.",
                layer=path,
                setting="track_running_stats",
                target="torch",
            )
        plan.steps.append(_copy_buffer(ours, theirs))
    for attr in ("eps", "momentum"):
        if hasattr(fresh, attr):
            if not hasattr(target, attr):
                raise NotExpressibleError(
                    f"the target {type(target).__name__} has no '{attr}'.", layer=path, setting=attr, target="torch"
                )
            plan.steps.append(_set_attribute(target, attr, getattr(fresh, attr)))
    extras = {key: value for key, value in markers.recall(fresh).items() if key != "name"}
    if frozen:
        extras["frozen_identity"] = tuple(frozen)
    kept_name = markers.recall(target).get("name")
    if kept_name is not None:
        extras["name"] = kept_name
    plan.steps.append(lambda: object.__setattr__(target, markers.ATTRIBUTE, extras))
    plan.steps.append(lambda: target.train(fresh.training))
    return plan


def _copy_parameter(source: torch.Tensor, target: torch.Tensor, requires_grad: bool | None) -> Callable[[], None]:
    def step() -> None:
        assign(target, source.detach().numpy())
        if requires_grad is not None:
            target.requires_grad_(requires_grad)

    return step


def _fill_identity(target: torch.Tensor, value: float) -> Callable[[], None]:
    def step() -> None:
        with torch.no_grad():
            target.fill_(value)
        target.requires_grad_(False)

    return step


def _copy_buffer(source: torch.Tensor, target: torch.Tensor) -> Callable[[], None]:
    return lambda: assign(target, source.detach().numpy())


def _set_attribute(obj: Any, name: str, value: Any) -> Callable[[], None]:
    return lambda: setattr(obj, name, value)


def snapshot(module: torch.nn.Module) -> Callable[[], None]:
    """A function that puts `module` back as it is now (tensors, flags, eps, momentum, mode, markers)."""
    tensors = {
        name: (t, t.detach().clone(), t.requires_grad)
        for name, t in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
    }
    attributes = {name: getattr(module, name) for name in ("eps", "momentum") if hasattr(module, name)}
    training = module.training
    restore_markers = markers.restorer(module)

    def restore() -> None:
        with torch.no_grad():
            for tensor, saved, requires_grad in tensors.values():
                tensor.copy_(saved)
                if tensor.is_floating_point():
                    tensor.requires_grad_(requires_grad)
        for name, value in attributes.items():
            setattr(module, name, value)
        module.train(training)
        restore_markers()

    return restore
