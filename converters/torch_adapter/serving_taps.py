"""Serving taps of PyTorch models: every BatchNorm input of sampled requests, reported to the collector's sink.

An nn.Module gets forward pre-hooks in place (the caller keeps serving the same object): one on the root marks the
request's start and which of its layers are observed (drawn per layer: `ServingTaps.per_layer`), one per BatchNorm the
recognizers find reads its input when its layer is drawn, a forward hook on the root marks the end. A layer not drawn
costs its hook one thread-local read. An ExportedProgram is served as
its `module()` with a `tap` call inserted before each batch-norm op of the graph (the program itself is untouched). A
GraphModule (what `ep.module()` returns, and how most people run a program) has no BatchNorm modules, only batch-norm
calls in its graph: the same `tap` calls go into its own graph, in place, and come out again when the monitor closes.

The root's pre-hook sees the request's keyword arguments too: they are bound to the forward's parameters, so
`model(pixel_values=x)` keeps `x` under the name `pixel_values`, as `model(x)` does; arguments that are not arrays
(None, flags) are options, not inputs, and are not kept.
A sampled layer input costs two reductions in its dtype, the per-channel sum and the per-channel 2-norm (squared into
the sum of squares), handed to the collector as small tensors; the float64 moments and the merge happen on the
collector's worker thread. (torch.var_mean over dims (0, 2, 3) was the obvious single call, and ran about ten times
slower than these two on CPU: 80 ms against 8 ms for the 53 BatchNorm inputs of a ResNet-50 at batch 1, one thread.)

For the collector's serving faults, the taps say which tapped BatchNorm modules are in train mode right now (read at
each window's close: `model.train()` after `monitor(...)` is seen too) and which batch-norm calls of a graph compute
batch statistics (`training=True`, as a program exported from a module in train mode does), and read the running
statistics each layer holds right now (a BatchNorm in train mode rewrites them on every request).
"""

from __future__ import annotations

import inspect
import itertools
import threading
from typing import Any

import numpy as np
import torch

from schemas import InputFileError, UnsupportedObjectError
from schemas.kinds import KIND_INFO

from ..serving_taps import ServingTaps, TappedLayer, TapSink
from . import torch_internals

BATCH = KIND_INFO["batch"]
_NARROW = (torch.float16, torch.bfloat16)

#: sink id -> sink, for the taps inserted into program graphs (a graph can only name importable functions and
#: constants).
_SINKS: dict[int, TapSink] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def _observe(sink: TapSink, index: int, x: torch.Tensor) -> None:
    try:
        x = x.detach()
        dims = [d for d in range(x.ndim) if d != 1]
        wide = (
            torch.float32 if x.dtype in _NARROW else None
        )  # float16 sums of squares overflow at 65504, bfloat16 ones keep 8 bits
        sums = x.sum(dim=dims, dtype=wide)
        squares = torch.linalg.vector_norm(x, dim=dims, dtype=wide).square_()
        sink.observe_sums(index, int(x.numel() // max(1, x.shape[1])), sums, squares)
    except Exception as error:  # never into the request path
        sink.failed(error)


def tap(x: torch.Tensor, sink_id: int, index: int) -> None:
    """Inserted before a program's batch-norm op: report its input when the request is sampled."""
    sink = _SINKS.get(sink_id)
    if sink is not None and sink.observing(index):
        _observe(sink, index, x)


def _layer(name: str, mean: torch.Tensor, var: torch.Tensor, eps: float) -> TappedLayer:
    return TappedLayer(name, mean.detach().double().numpy().copy(), var.detach().double().numpy().copy(), float(eps))


def _argument_names(forward) -> list[str] | None:
    """The positional argument names of a forward (the names a traffic sample gives its arrays), or None."""
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return None
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names or None


def _is_array(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray))


class _Inputs:
    """A request's arguments as the inputs a traffic sample keeps: bound to the forward's parameters, in their order and
    under their names, whether passed by position or by keyword."""

    def __init__(self, signature: inspect.Signature):
        self.signature = signature

    def __call__(self, args: tuple, kwargs: dict) -> tuple[tuple, tuple[str, ...]]:
        bound = self.signature.bind(*args, **kwargs)
        pairs: list[tuple[str, Any]] = []
        for name, value in bound.arguments.items():
            kind = self.signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                pairs += [(f"{name}_{i}", v) for i, v in enumerate(value)]
            elif kind is inspect.Parameter.VAR_KEYWORD:
                pairs += list(value.items())
            else:
                pairs.append((name, value))
        for name, value in pairs:
            if isinstance(value, (list, tuple, dict)) and any(
                _is_array(v) for v in (value.values() if isinstance(value, dict) else value)
            ):
                raise InputFileError(
                    f"input '{name}' is a {type(value).__name__} of tensors; keep_sample keeps array inputs: pass its tensors "
                    "as arguments of their own."
                )
        kept = [(name, value) for name, value in pairs if _is_array(value)]
        return tuple(value for _, value in kept), tuple(name for name, _ in kept)


def _inputs_of(module: torch.nn.Module) -> tuple[_Inputs | None, str | None]:
    """(how a request's arguments become kept inputs, or None; why they cannot be kept, or None)."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return None, (
            f"the signature of {type(module).__name__}.forward cannot be read, so its keyword inputs cannot be named; "
            "monitor without keep_sample, or wrap the model in a module whose forward names its inputs."
        )
    if isinstance(module, torch.fx.GraphModule):
        flat = {node.name for node in module.graph.nodes if node.op == "placeholder"}
        named = [p.name for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        nested = [name for name in named if name not in flat]
        if nested and len(flat) > len(named):
            return None, (
                f"input '{nested[0]}' of the {type(module).__name__} holds several tensors (its graph reads "
                f"{', '.join(sorted(n for n in flat if n.startswith(nested[0])))}), and keep_sample keeps array inputs; "
                "export the model with each tensor as an argument of its own, or monitor without keep_sample."
            )
    return _Inputs(signature), None


def _root_hooks(root: torch.nn.Module, sink: TapSink, inputs: _Inputs | None) -> list:
    def starts(_module, args, kwargs) -> None:  # a pre-hook returning anything but None would replace the arguments
        if sink.begin():
            if inputs is None:
                sink.keep(args)
                return
            try:
                values, names = inputs(args, kwargs)
            except (
                Exception
            ) as error:  # never into the request path: the forward itself says what is wrong with the call
                sink.failed(error)
                return
            sink.keep(values, names)

    def ends(_module, _args, _out) -> None:
        sink.end()

    return [root.register_forward_pre_hook(starts, with_kwargs=True), root.register_forward_hook(ends)]


#: Ops whose `training` argument says whether they normalize with the batch's statistics; the no_training op never does.
_TRAINING_OFF = "aten::_native_batch_norm_legit_no_training"


def _computes_batch_statistics(node: Any, kwargs: dict) -> bool:
    """Whether a batch-norm call of a graph normalizes with the batch's own statistics (training=True)."""
    return torch_internals.op_name(node) != _TRAINING_OFF and kwargs.get("training") is True


def _graph_faults(module: torch.fx.GraphModule) -> list[tuple[str, str | None, str]]:
    """A batch_statistics_in_graph fault per batch-norm call of `module`'s graph that computes batch statistics."""
    found = []
    for node, kwargs in _graph_sites(module):
        if _computes_batch_statistics(node, kwargs):
            name = str(kwargs["running_mean"].target).removesuffix(".running_mean")
            op = torch_internals.op_name(node)
            found.append(
                (
                    "batch_statistics_in_graph",
                    name,
                    f"{op} with training=True in the served graph: each request "
                    "is normalized by its own batch; export the model after model.eval()",
                )
            )
    return found


def _graph_buffers(module: torch.fx.GraphModule) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The running statistics buffers each batch-norm call of the graph reads, in the order `_tap_graph` taps them."""
    buffer = lambda node: module.get_buffer(str(node.target))  # noqa: E731
    return [(buffer(kwargs["running_mean"]), buffer(kwargs["running_var"])) for _, kwargs in _graph_sites(module)]


def _graph_sites(module: torch.fx.GraphModule) -> list[tuple[Any, dict]]:
    """(node, its arguments by name) of every batch-norm call in the graph that reads running statistics from
    buffers."""
    from torch.fx.operator_schemas import normalize_function

    found = []
    for node in module.graph.nodes:
        if torch_internals.op_name(node) not in BATCH.aten_ops:
            continue
        bound = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
        kwargs = bound.kwargs if bound is not None else {}
        if all(
            isinstance(kwargs.get(k), torch.fx.Node) and kwargs[k].op == "get_attr"
            for k in ("running_mean", "running_var")
        ):
            found.append((node, kwargs))
    return found


def has_graph_batchnorms(module: Any) -> bool:
    """Whether `module` is a GraphModule whose graph calls batch norm on running statistics
    (an ExportedProgram's module())."""
    return isinstance(module, torch.fx.GraphModule) and bool(_graph_sites(module))


def _tap_graph(module: torch.fx.GraphModule, sink_id: int, first: int) -> tuple[list[TappedLayer], list]:
    """Insert a `tap` before every batch-norm call of `module`'s graph (layer indexes from `first`);
    (layers, inserted nodes)."""
    layers, inserted = [], []
    graph = module.graph
    for node, kwargs in _graph_sites(module):
        mean_node, var_node = kwargs["running_mean"], kwargs["running_var"]
        name = str(mean_node.target).removesuffix(".running_mean")
        layers.append(
            _layer(
                name,
                module.get_buffer(str(mean_node.target)),
                module.get_buffer(str(var_node.target)),
                kwargs.get("eps", 1e-5),
            )
        )
        with graph.inserting_before(node):
            inserted.append(graph.call_function(tap, (kwargs["input"], sink_id, first + len(layers) - 1)))
    if inserted:
        module.recompile()
    return layers, inserted


def _read(buffers: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Copies of the running statistics the served object holds right now, as float64 arrays."""
    return [(mean.detach().double().numpy().copy(), var.detach().double().numpy().copy()) for mean, var in buffers]


def _register(sink: TapSink) -> int:
    with _lock:
        sink_id = next(_ids)
        _SINKS[sink_id] = sink
    return sink_id


def module_taps(model: torch.nn.Module, refs: list, sink: TapSink, eps: list[float]) -> ServingTaps:
    """Hooks on `model` itself for every BatchNorm in `refs` (NormLayerRef of kind batch with running statistics; `eps`,
    each one's, as its spec reads it: a frozen BatchNorm may keep it in its forward, not in an attribute), and, for a
    GraphModule, `tap` calls inserted into its own graph before each batch-norm call (taken out again by `remove`)."""
    layers, handles = [], []
    for index, ref in enumerate(refs):
        module = ref.obj
        layers.append(_layer(ref.path, module.running_mean, module.running_var, eps[index]))

        def hook(_module, args, index=index):
            if sink.observing(index):
                _observe(sink, index, args[0])

        handles.append(module.register_forward_pre_hook(hook))
    sink_id, inserted = None, []
    if isinstance(model, torch.fx.GraphModule):
        sink_id = _register(sink)
        tapped, inserted = _tap_graph(model, sink_id, len(layers))
        layers += tapped
    inputs, refusal = _inputs_of(model)
    handles += _root_hooks(model, sink, inputs)
    buffers = [(ref.obj.running_mean, ref.obj.running_var) for ref in refs]
    if isinstance(model, torch.fx.GraphModule):
        buffers += _graph_buffers(model)
    graph_faults = _graph_faults(model) if isinstance(model, torch.fx.GraphModule) else []

    def faults() -> list[tuple[str, str | None, str]]:
        why = (
            "the BatchNorm is in train mode (training=True): each request is normalized by its own batch and rewrites "
            "the running statistics; call model.eval() before serving"
        )
        trained = [("train_mode", ref.path, why) for ref in refs if ref.obj.training]
        return trained + graph_faults

    def remove() -> None:
        for handle in handles:
            handle.remove()
        if inserted:
            for node in inserted:
                model.graph.erase_node(node)
            model.recompile()
        _SINKS.pop(sink_id, None)

    return ServingTaps(
        model,
        layers,
        remove,
        _argument_names(model.forward),
        per_layer=True,
        keep_refusal=refusal,
        faults=faults,
        statistics=lambda: _read(buffers),
    )


def program_taps(program: Any, sink: TapSink) -> ServingTaps:
    """`program.module()` with a `tap` before every batch-norm op that reads running statistics."""
    module = program.module()
    sink_id = _register(sink)
    layers, _ = _tap_graph(module, sink_id, 0)
    if not layers:
        _SINKS.pop(sink_id, None)
        raise UnsupportedObjectError("the ExportedProgram has no batch-norm op reading running statistics to monitor.")
    inputs, refusal = _inputs_of(module)
    handles = _root_hooks(module, sink, inputs)
    buffers = _graph_buffers(module)
    graph_faults = _graph_faults(module)

    def remove() -> None:
        for handle in handles:
            handle.remove()
        _SINKS.pop(sink_id, None)

    return ServingTaps(
        module,
        layers,
        remove,
        _argument_names(module.forward),
        per_layer=True,
        keep_refusal=refusal,
        faults=lambda: list(graph_faults),
        statistics=lambda: _read(buffers),
    )


__all__ = ["has_graph_batchnorms", "module_taps", "program_taps", "tap"]
