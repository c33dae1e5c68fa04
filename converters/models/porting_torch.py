"""PyTorch side of porting: normalization modules of an ExportedProgram, and writing into an existing module.

An ExportedProgram (a `.pt2` file) no longer holds `nn.BatchNorm2d` objects: its graph calls
`aten.batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, ...)`
and friends, and `node.meta["nn_module_stack"]` says which module each call came from.
Each such call is rebuilt here as the torch.nn module it came from, with the state from the
program's state dict, so the ordinary adapters read it. Nothing from the file is executed.

Writing goes into a module that already sits in the user's model: the module is never
replaced, its parameters and buffers are overwritten in place, bit-exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from schemas import LayerReport, NotExpressibleError, UnsupportedObjectError

from .. import markers
from ..torch_adapter.common import assign

#: aten op -> (kind, argument positions). Export's default (training) IR keeps the composite ops;
#: run_decompositions() turns BatchNorm and LayerNorm into the native_* forms listed too.
_OPS: dict[str, tuple[str, dict[str, int]]] = {
    "aten.batch_norm.default": ("batch", dict(weight=1, bias=2, mean=3, var=4, training=5, momentum=6, eps=7)),
    "aten._native_batch_norm_legit_no_training.default": ("batch", dict(weight=1, bias=2, mean=3, var=4, momentum=5, eps=6)),
    "aten._native_batch_norm_legit_functional.default": ("batch", dict(weight=1, bias=2, mean=3, var=4, training=5, momentum=6, eps=7)),
    "aten.instance_norm.default": ("instance", dict(weight=1, bias=2, mean=3, var=4, use_input_stats=5, momentum=6, eps=7)),
    "aten.group_norm.default": ("group", dict(groups=1, weight=2, bias=3, eps=4)),
    "aten.layer_norm.default": ("layer", dict(shape=1, weight=2, bias=3, eps=4)),
    "aten.native_layer_norm.default": ("layer", dict(shape=1, weight=2, bias=3, eps=4)),
    "aten.rms_norm.default": ("rms", dict(shape=1, weight=2, eps=3)),
}
#: torch.nn classes whose calls must be found as one of the ops above (else they were decomposed).
_NORM_CLASS_PREFIXES = ("torch.nn.modules.batchnorm.", "torch.nn.modules.instancenorm.", "torch.nn.modules.normalization.")
_NORM_CLASS_NAMES = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "GroupNorm", "LayerNorm", "RMSNorm")


def is_exported_program(obj: Any) -> bool:
    return isinstance(obj, torch.export.ExportedProgram)


class _ProgramState:
    """Resolves graph placeholders to the program's parameters, buffers and constants."""

    def __init__(self, program: torch.export.ExportedProgram):
        signature = program.graph_signature
        self.by_placeholder = {**signature.inputs_to_parameters, **signature.inputs_to_buffers, **signature.inputs_to_lifted_tensor_constants}
        self.values = {**program.state_dict, **program.constants}

    def tensor(self, node: Any, layer: str, setting: str) -> torch.Tensor | None:
        if node is None:
            return None
        name = self.by_placeholder.get(getattr(node, "name", None))
        if name is None or name not in self.values:
            raise UnsupportedObjectError(
                f"the {setting} of the exported call is computed in the graph, expected a parameter or buffer of the program; "
                "export the model without transforming its normalization state.",
                layer=layer, setting=setting,
            )
        return self.values[name].detach()

    def fqn(self, node: Any) -> str | None:
        return self.by_placeholder.get(getattr(node, "name", None))


def _module_of(node: Any) -> tuple[str, str] | None:
    """(path, class name) of the innermost module a graph node came from."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    path, cls = list(stack.values())[-1]
    return str(path), cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"


def _argument(node: Any, positions: dict[str, int], name: str, default: Any = None) -> Any:
    index = positions.get(name)
    if index is None or index >= len(node.args):
        return node.kwargs.get(name, default)
    return node.args[index]


def _input_rank(node: Any, path: str) -> int:
    value = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else None
    if value is None or not hasattr(value, "shape"):
        raise UnsupportedObjectError("the exported call records no input shape, expected the example input's shape in node.meta['val'].", layer=path)
    return len(value.shape)


def _rebuild(node: Any, kind: str, positions: dict[str, int], path: str, state: _ProgramState) -> torch.nn.Module:
    """The torch.nn module whose call produced `node`, with its state."""
    weight = state.tensor(_argument(node, positions, "weight"), path, "weight")
    bias = state.tensor(_argument(node, positions, "bias"), path, "bias")
    eps = _argument(node, positions, "eps")
    dtype = (weight if weight is not None else node.args[0].meta["val"]).dtype
    if kind in ("batch", "instance"):
        mean = state.tensor(_argument(node, positions, "mean"), path, "running_mean")
        var = state.tensor(_argument(node, positions, "var"), path, "running_var")
        spatial = _input_rank(node, path) - 2
        if not 1 <= spatial <= 3:
            spatial = 1  # BatchNorm1d also takes (N, C)
        channels = int(node.args[0].meta["val"].shape[1])  # (N, C, ...) for every BatchNorm/InstanceNorm input
        momentum = _argument(node, positions, "momentum", 0.1)
        if momentum == 0.0 and mean is not None:
            # nn.BatchNorm passes 0.0 for momentum=None outside training (torch/nn/modules/batchnorm.py),
            # so 0.0 in the graph is momentum=None or a frozen momentum of 0; None is the one anyone uses.
            momentum = None
        name = {"batch": "BatchNorm", "instance": "InstanceNorm"}[kind] + f"{spatial}d"
        module = getattr(torch.nn, name)(
            channels, eps=float(eps), momentum=momentum, affine=weight is not None, track_running_stats=mean is not None, dtype=dtype
        )
        if mean is not None:
            assign(module.running_mean, mean.numpy())
            assign(module.running_var, var.numpy())
            counter_name = (state.fqn(_argument(node, positions, "mean")) or "").rsplit(".", 1)[0] + ".num_batches_tracked"
            if counter_name in state.values:
                assign(module.num_batches_tracked, state.values[counter_name].numpy())
        training = bool(_argument(node, positions, "training", False)) if kind == "batch" else False
        if kind == "instance" and mean is not None:
            training = bool(_argument(node, positions, "use_input_stats", False))
    elif kind == "group":
        channels = int(node.args[0].meta["val"].shape[1])
        module = torch.nn.GroupNorm(int(_argument(node, positions, "groups")), channels, eps=float(eps), affine=weight is not None, dtype=dtype)
        training = False
    elif kind == "layer":
        shape = tuple(int(d) for d in _argument(node, positions, "shape"))
        module = torch.nn.LayerNorm(shape, eps=float(eps), elementwise_affine=weight is not None, bias=bias is not None, dtype=dtype)
        training = False
    else:
        shape = tuple(int(d) for d in _argument(node, positions, "shape"))
        module = torch.nn.RMSNorm(shape, eps=None if eps is None else float(eps), elementwise_affine=weight is not None, dtype=dtype)
        training = False
    if weight is not None:
        assign(module.weight, weight.numpy())
    if bias is not None and getattr(module, "bias", None) is not None:
        assign(module.bias, bias.numpy())
    markers.remember(module, name=path, input_rank=_input_rank(node, path))
    return module.train(training)


def exported_norm_modules(program: torch.export.ExportedProgram) -> list[tuple[str, torch.nn.Module]]:
    """(module path, rebuilt torch.nn module) for every normalization call of `program`, in graph order."""
    state = _ProgramState(program)
    found: dict[str, torch.nn.Module] = {}
    norm_paths: dict[str, str] = {}
    for node in program.graph.nodes:
        owner = _module_of(node) if node.op == "call_function" else None
        if owner is not None and owner[1].startswith(_NORM_CLASS_PREFIXES) and owner[1].rsplit(".", 1)[-1] in _NORM_CLASS_NAMES:
            norm_paths.setdefault(owner[0], owner[1])
        if node.op != "call_function" or str(node.target) not in _OPS:
            continue
        kind, positions = _OPS[str(node.target)]
        path = owner[0] if owner is not None else node.name
        if path not in found:  # a module called twice shares its state: port it once
            found[path] = _rebuild(node, kind, positions, path, state)
    missing = [path for path in norm_paths if path not in found]
    if missing:
        raise UnsupportedObjectError(
            f"the exported program computes {norm_paths[missing[0]].rsplit('.', 1)[-1]} '{missing[0]}' with primitive ops "
            f"({len(missing)} such layer(s)), expected one normalization call per layer; export with torch.export.export() "
            "and do not call run_decompositions() before saving.",
            layer=missing[0],
        )
    return list(found.items())


# -- writing into an existing module ------------------------------------------------------

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
                layer=path, setting=flag, target="torch",
            )
        if ours is not None:
            # requires_grad is the user's choice on the target; it changes only where normbridge freezes
            # an identity (the converter froze `ours`) or had frozen one that now gets real values.
            freeze = not ours.requires_grad
            plan.steps.append(_copy_parameter(ours, theirs, False if freeze else True if flag in frozen_before else None))
            if freeze:
                frozen.append(flag)
        elif theirs is not None:
            # The source has no such parameter: the target's becomes a frozen identity, as the converter emits it.
            plan.steps.append(_fill_identity(theirs, identity))
            frozen.append(flag)
            report.add(flag, False, f"frozen {attr} = {identity:g}", "stored", f"the target {type(target).__name__} has a '{attr}' the source lacks; set to the identity and frozen")
    for name in _BUFFERS:
        ours, theirs = getattr(fresh, name, None), getattr(target, name, None)
        if ours is None and theirs is None:
            continue
        if ours is None or theirs is None:
            raise NotExpressibleError(
                f"the source {'tracks' if ours is not None else 'does not track'} running statistics but the target {type(target).__name__} "
                f"{'does not' if theirs is None else 'does'} ('{name}'); rebuild the target layer with track_running_stats={ours is not None}.",
                layer=path, setting="track_running_stats", target="torch",
            )
        plan.steps.append(_copy_buffer(ours, theirs))
    for attr in ("eps", "momentum"):
        if hasattr(fresh, attr):
            if not hasattr(target, attr):
                raise NotExpressibleError(f"the target {type(target).__name__} has no '{attr}'.", layer=path, setting=attr, target="torch")
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
    tensors = {name: (t, t.detach().clone(), t.requires_grad) for name, t in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))}
    attributes = {name: getattr(module, name) for name in ("eps", "momentum") if hasattr(module, name)}
    training = module.training
    extras = getattr(module, markers.ATTRIBUTE, None)

    def restore() -> None:
        with torch.no_grad():
            for tensor, saved, requires_grad in tensors.values():
                tensor.copy_(saved)
                if tensor.is_floating_point():
                    tensor.requires_grad_(requires_grad)
        for name, value in attributes.items():
            setattr(module, name, value)
        module.train(training)
        if extras is None:
            if markers.ATTRIBUTE in module.__dict__:
                object.__delattr__(module, markers.ATTRIBUTE)
        else:
            object.__setattr__(module, markers.ATTRIBUTE, extras)

    return restore

