"""Running PyTorch models for the whole-model tools: the contract's source side, inputs, and the order layers run in."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from schemas import NormSpec, UnsupportedObjectError

from ..api import layer_spec
from ..model_values import InputSpec, ModelRunner, NormLayerRef, Outputs
from . import torch_internals


def _tensors(arrays) -> list[torch.Tensor]:
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]


def flatten(value: Any) -> Outputs:
    """Model outputs as a flat list: tensors, and tuples, lists or dicts of them, in order."""
    if isinstance(value, dict):
        return [a for v in value.values() for a in flatten(v)]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in flatten(v)]
    if hasattr(value, "detach"):
        return [value.detach().cpu().numpy()]
    return [np.asarray(value)]


def module_runner(module: torch.nn.Module) -> ModelRunner:
    """A deep copy of `module` in eval mode; a finding names the layers the caller left in train mode."""
    served = copy.deepcopy(module).eval()
    mode_dependent = torch_internals.norm_base_classes() + torch_internals.dropout_base_classes()
    in_train = [
        f"{type(m).__name__} '{name or type(m).__name__}'"
        for name, m in module.named_modules()
        if m.training and isinstance(m, mode_dependent)
    ]
    findings = []
    if in_train:
        shown = ", ".join(in_train[:4]) + (f" and {len(in_train) - 4} more" if len(in_train) > 4 else "")
        findings.append(
            f"source module is in train mode ({shown}); the contract replays a deep copy in eval mode, which is what serving must compute"
        )

    def run(arrays):
        with torch.no_grad():
            return flatten(served(*_tensors(arrays)))

    return ModelRunner(run, f"torch {type(module).__name__} (deep copy in eval mode)", [], findings)


def exported_program_train_ops(program) -> list[str]:
    """Nodes of an ExportedProgram that compute in train mode (batch statistics, active dropout).

    A module exported while in `.train()` keeps `training=True` in its graph; an ExportedProgram
    cannot be switched to eval (`.module().eval()` raises NotImplementedError in torch 2.x).
    """
    from torch.fx.operator_schemas import normalize_function

    found = []
    for node in program.graph.nodes:
        name = torch_internals.op_name(node)
        if name is None or not any(word in name for word in ("batch_norm", "dropout")):
            continue
        normalized = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
        kwargs = normalized.kwargs if normalized else {}
        flag = kwargs.get("training", kwargs.get("train"))
        if flag is True:
            found.append(f"'{node.name}' ({name} with {'training' if 'training' in kwargs else 'train'}=True)")
    return found


def program_runner(program) -> ModelRunner:
    """The program as traced (it cannot be switched to eval); a finding names its train-mode ops."""
    module = program.module()
    train_ops = exported_program_train_ops(program)
    findings = []
    if train_ops:
        findings.append(
            f"source ExportedProgram computes in train mode at {', '.join(train_ops)}: it was exported from a module in .train() and "
            "cannot be switched to eval; export the module again after .eval()"
        )

    def run(arrays):
        args, kwargs = program_call(program, _tensors(arrays))
        with torch.no_grad():
            return flatten(module(*args, **kwargs))

    return ModelRunner(run, "torch ExportedProgram (as traced)", program_input_specs(program), findings)


def program_call(program, tensors: list) -> tuple[tuple, dict]:
    """(args, kwargs) for `program.module()`: the tensors in place of the tensor inputs, and the constants the program
    was exported with (`use_cache=False`) where it recorded them, which its module insists on being passed again."""
    given = iter(tensors)
    leaves = [next(given) if isinstance(name, str) else name for name in program.graph_signature.user_inputs]
    return torch_internals.tree_unflatten(leaves, program.call_spec.in_spec)


def program_input_specs(program) -> list[InputSpec]:
    """The user inputs of an ExportedProgram, from its placeholders' example values."""
    by_name = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    specs = []
    for name in program.graph_signature.user_inputs:
        if not isinstance(name, str):
            continue  # a constant the program was exported with (use_cache=False): program_call passes it again
        value = by_name[name].meta.get("val")
        if value is None or not hasattr(value, "shape"):
            raise UnsupportedObjectError(
                f"input '{name}' of the ExportedProgram is not a tensor; pass a sample for it."
            )
        shape = tuple(d if isinstance(d, int) else None for d in value.shape)
        specs.append(InputSpec(name, shape, str(value.dtype).removeprefix("torch.")))
    return specs


def specs_in_execution_order(module: torch.nn.Module, refs: list[NormLayerRef], sample) -> list[NormSpec]:
    """Specs of a module's normalization layers in the order a forward pass calls them (definition order can differ)."""
    order: list[int] = []
    probe = copy.deepcopy(module).eval()
    modules = dict(probe.named_modules())
    targets = [modules.get(r.path, probe if r.path == type(probe).__name__ else None) for r in refs]
    by_id = {id(m): i for i, m in enumerate(targets) if m is not None}
    handles = [
        m.register_forward_pre_hook(lambda mod, _args: order.append(by_id[id(mod)])) for m in targets if m is not None
    ]
    try:
        with torch.no_grad():
            probe(*_tensors(sample.rows(slice(0, 2))))
    finally:
        for handle in handles:
            handle.remove()
    seen = list(dict.fromkeys(order)) + [i for i in range(len(refs)) if i not in order]
    return [layer_spec(refs[i]) for i in seen]
