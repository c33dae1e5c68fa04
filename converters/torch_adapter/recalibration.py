"""Recalibrating the BatchNorm statistics of PyTorch models: population statistics, layer by layer, in eval mode.

Each layer's new running statistics are the mean and variance of its input over every sample given, pooled in float64
(model_values.population_statistics), measured with the model in eval mode and every BatchNorm upstream of the layer
already on its new statistics, rounded to the buffer's dtype as the recalibrated model will hold them. The batch size
is memory only. The waves of layers measured per pass come from converters/recalibration_waves.py.

- nn.Module: a deep copy, forward pre-hooks; without a graph each layer is a pass of its own, in the order a forward
  calls them, and a pass stops at the next pending layer (the rest of the forward is not needed).
- ExportedProgram: an FX interpreter over `program.module()` computes every batch-norm call itself, in eval mode on the
  statistics of the moment; its graph gives each layer's upstream layers, so a pass measures a whole wave and stops
  after the wave's last call. The new statistics go into a copy of the state dict; the graph is unchanged.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from schemas import InputFileError, NormbridgeError, UnsupportedObjectError
from schemas.kinds import KIND_INFO

from ..model_values import LayerMoments, Movement, first_line, population_statistics
from ..recalibration_waves import upstream_layers, waves
from . import torch_internals
from .statistics import _tensors, batchnorm_modules

BATCH = KIND_INFO["batch"]


class _Enough(Exception):
    """Raised inside a forward once its pass has measured every layer it came for."""


def _record(moments: LayerMoments, x: torch.Tensor) -> None:
    moments.add(x.detach().to(torch.float64).numpy(), 1)


def _refused(batch, error: BaseException, what: str = "the model") -> InputFileError:
    return InputFileError(
        f"{what} refused a recalibration batch of shape {[list(a.shape) for a in batch]} "
        f"({type(error).__name__}: {first_line(error)})."
    )


def _call_order(module: torch.nn.Module, layers: dict[str, torch.nn.Module], batch) -> list[str]:
    """The layers in the order one forward calls them; a layer called twice is refused (its uses may feed one another,
    which a module without a graph cannot tell)."""
    calls: list[str] = []
    names = {id(m): name for name, m in layers.items()}
    handles = [m.register_forward_pre_hook(lambda mod, _args: calls.append(names[id(mod)])) for m in layers.values()]
    try:
        with torch.no_grad():
            module(*_tensors(batch))
    except (ValueError, RuntimeError) as error:
        raise _refused(batch, error) from error
    finally:
        for handle in handles:
            handle.remove()
    twice = [name for name, count in Counter(calls).items() if count > 1]
    if twice:
        raise UnsupportedObjectError(
            f"layer '{twice[0]}' runs {calls.count(twice[0])} times per forward (a shared module), so whether its statistics feed its "
            "own input cannot be read from an nn.Module; recalibrate its torch.export program (.pt2), whose graph shows it."
        )
    return list(dict.fromkeys(calls))


def recalibrate_module(
    module: torch.nn.Module, batches: list[tuple[np.ndarray, ...]], variance_estimator: str
) -> tuple[torch.nn.Module, list[Movement], str]:
    """A deep copy in eval mode whose BatchNorm buffers hold the population statistics of their inputs
    (see the module docstring)."""
    new = copy.deepcopy(module)
    modes = {name: m.training for name, m in new.named_modules()}
    layers = dict(batchnorm_modules(new))
    before = {name: (bn.running_mean.detach().clone(), bn.running_var.detach().clone()) for name, bn in layers.items()}
    new.eval()
    try:
        order = _call_order(new, layers, batches[0])
        for wave in waves(order):
            _measure_module_wave(new, layers, order, wave, batches, variance_estimator)
    finally:
        for name, m in new.named_modules():
            m.training = modes[name]
    for name in order:
        if layers[name].num_batches_tracked is not None:
            layers[name].num_batches_tracked.fill_(len(batches))
    moved = [
        (
            name,
            *before[name],
            layers[name].running_mean.detach(),
            layers[name].running_var.detach(),
            float(layers[name].eps),
        )
        for name in order
    ]
    method = (
        "population statistics of each BatchNorm's input over all samples (pooled in float64), measured layer by layer on a deep copy "
        f"in eval mode with the layers before it on their new statistics; {variance_estimator} variance; weights, momentum and modes unchanged"
    )
    idle = [name for name in layers if name not in order]
    if idle:  # said, not skipped silently: a BatchNorm the forward never calls (an unused head) keeps its statistics
        method += f"; {len(idle)} BatchNorm(s) the forward never called keep their statistics ({', '.join(idle[:3])})"
    return new, moved, method


def _measure_module_wave(new, layers, order, wave, batches, variance_estimator) -> None:
    [name] = wave  # without a graph every wave is one layer
    bn = layers[name]
    moments = LayerMoments(
        name,
        bn.running_mean.detach().double().numpy().copy(),
        bn.running_var.detach().double().numpy().copy(),
        float(bn.eps),
    )
    later = set(order[order.index(name) + 1 :])

    def measure(_m, args):
        _record(moments, args[0])

    def stop(_m, _args):
        raise _Enough

    handles = [bn.register_forward_pre_hook(measure)] + [layers[n].register_forward_pre_hook(stop) for n in later]
    try:
        with torch.no_grad():
            for index, batch in enumerate(batches):
                seen = len(moments.counts)
                try:
                    new(*_tensors(batch))
                except _Enough:
                    pass
                except (ValueError, RuntimeError) as error:
                    raise _refused(batch, error) from error
                if len(moments.counts) == seen:
                    raise UnsupportedObjectError(
                        f"layer '{name}' did not run before the layers after it on batch {index} (the model calls its "
                        "BatchNorms in an order that depends on the data); recalibrate its torch.export program (.pt2)."
                    )
    finally:
        for handle in handles:
            handle.remove()
    mean, var = population_statistics(moments, variance_estimator)
    with torch.no_grad():
        bn.running_mean.copy_(torch.from_numpy(mean).to(bn.running_mean.dtype))
        bn.running_var.copy_(torch.from_numpy(var).to(bn.running_var.dtype))


# -- ExportedProgram --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Site:
    """One batch-norm call of the graph: its layer (named after its running_mean buffer), buffer names and eps."""

    layer: str
    mean_key: str
    var_key: str
    eps: float


def _program_sites(module: torch.fx.GraphModule) -> tuple[dict[Any, _Site], dict[str, set[str]]]:
    """(the batch-norm calls reading running statistics, by node; each layer's upstream layers, from the graph)."""
    from torch.fx.operator_schemas import normalize_function

    sites: dict[Any, _Site] = {}
    steps = []
    for node in module.graph.nodes:
        schema = torch_internals.op_schema(node.target) if node.op == "call_function" else None
        written: list[str] = []
        if schema is not None:
            written = _written(node, schema)
            if schema.name in BATCH.aten_ops:
                bound = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
                kwargs = bound.kwargs if bound is not None else {}
                mean, var = kwargs.get("running_mean"), kwargs.get("running_var")
                if mean is not None:
                    if not all(isinstance(n, torch.fx.Node) and n.op == "get_attr" for n in (mean, var)):
                        raise UnsupportedObjectError(
                            f"a batch-norm call ('{node.name}') reads running statistics the graph computes, not buffers of "
                            "the program's state dict; recalibrate the nn.Module and export again."
                        )
                    sites[node] = _Site(
                        str(mean.target).removesuffix(".running_mean"),
                        str(mean.target),
                        str(var.target),
                        float(kwargs.get("eps", BATCH.default_eps["torch"])),
                    )
        steps.append(
            (
                [n.name for n in node.all_input_nodes],
                [node.name, *written],
                sites[node].layer if node in sites else None,
            )
        )
    return sites, upstream_layers(steps)


def _written(node, schema) -> list[str]:
    """The nodes an in-place op writes into (its schema's mutable arguments), so their later readers depend on it."""
    names = []
    for index, argument in enumerate(schema.arguments):
        alias = getattr(argument, "alias_info", None)
        if alias is None or not alias.is_write:
            continue
        value = node.args[index] if index < len(node.args) else node.kwargs.get(argument.name)
        if isinstance(value, torch.fx.Node):
            names.append(value.name)
    return names


class _WavePass(torch.fx.Interpreter):
    """Runs the program with every batch-norm call in eval mode on `stats` (the new statistics of finalized layers, else
    the program's), records the inputs of the wave's layers and stops after the wave's last call."""

    def __init__(
        self,
        module,
        sites: dict[Any, _Site],
        stats: dict[str, tuple[torch.Tensor, torch.Tensor]],
        records: dict[str, LayerMoments],
    ):
        super().__init__(module)
        self.sites, self.stats, self.records = sites, stats, records
        self.calls = sum(1 for site in sites.values() if site.layer in records)
        self.left = 0

    def run_batch(self, *args) -> None:
        self.left = self.calls
        try:
            self.run(*args)
        except _Enough:
            pass

    def run_node(self, node):
        site = self.sites.get(node)
        if site is None:
            return super().run_node(node)
        from torch.fx.operator_schemas import normalize_function

        args, kwargs = self.fetch_args_kwargs_from_env(node)
        bound = normalize_function(node.target, args, kwargs, normalize_to_only_use_kwargs=True).kwargs
        if site.layer in self.records:
            _record(self.records[site.layer], bound["input"])
            self.left -= 1
            if self.left == 0:
                raise _Enough
        mean, var = self.stats.get(site.layer, (bound["running_mean"], bound["running_var"]))
        out = F.batch_norm(
            bound["input"],
            mean,
            var,
            bound.get("weight"),
            bound.get("bias"),
            training=False,
            momentum=0.0,
            eps=bound["eps"],
        )
        returns = len(torch_internals.op_schema(node.target).returns)
        # the extra results of the native ops: batch statistics a training call would save (none in eval), and for the
        # functional op the updated running statistics, which in eval are the ones used
        extra = (torch.empty(0), torch.empty(0), mean, var)[: returns - 1]
        return out if returns == 1 else (out, *extra)


def recalibrate_program(
    program, batches: list[tuple[np.ndarray, ...]], variance_estimator: str
) -> tuple[Any, list[Movement], str]:
    """A copy of the program whose state dict holds each layer's population statistics (see the module docstring)."""
    module = program.module()
    sites, upstream = _program_sites(module)
    buffers = dict(module.named_buffers())
    order = list(dict.fromkeys(site.layer for site in sites.values()))
    first = {site.layer: site for site in reversed(list(sites.values()))}
    stats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    results: dict[str, tuple[LayerMoments, np.ndarray, np.ndarray]] = {}
    for wave in waves(order, upstream):
        records = {}
        for name in wave:
            site = first[name]
            records[name] = LayerMoments(
                name,
                buffers[site.mean_key].detach().double().numpy().copy(),
                buffers[site.var_key].detach().double().numpy().copy(),
                site.eps,
            )
        runner = _WavePass(module, sites, stats, records)
        with torch.no_grad():
            for batch in batches:
                try:
                    runner.run_batch(*_tensors(batch))
                except NormbridgeError:
                    raise
                except Exception as error:  # guards of a fixed-shape program, a dtype it does not take, ...
                    raise _refused(batch, error, "the ExportedProgram") from error
        for name, record in records.items():
            mean, var = population_statistics(record, variance_estimator)
            site = first[name]
            stats[name] = (
                torch.from_numpy(mean).to(buffers[site.mean_key].dtype),
                torch.from_numpy(var).to(buffers[site.var_key].dtype),
            )
            results[name] = (record, mean, var)
    new = copy.deepcopy(program)
    state = new.state_dict
    moved = []
    for name in order:
        site, (record, mean, var) = first[name], results[name]
        if not all(k in state for k in (site.mean_key, site.var_key)):
            raise UnsupportedObjectError(
                f"layer '{name}': its running statistics are not buffers of the program's state dict; recalibrate the nn.Module and export again."
            )
        with torch.no_grad():
            state[site.mean_key].copy_(stats[name][0])
            state[site.var_key].copy_(stats[name][1])
            tracked = f"{name}.num_batches_tracked"
            if tracked in state:
                state[tracked].fill_(len(batches))
        moved.append((name, record.running_mean, record.running_var, mean, var, site.eps))
    method = (
        "FX interpreter over the program in eval mode: population statistics of each BatchNorm's input over all samples (pooled in "
        f"float64), measured wave by wave with the layers upstream on their new statistics; {variance_estimator} variance, rounded once "
        "into the state dict (graph unchanged)"
    )
    return new, moved, method


__all__ = ["recalibrate_module", "recalibrate_program"]
