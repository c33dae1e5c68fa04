"""Serving taps of PyTorch models: every BatchNorm input of sampled requests, reported to the collector's sink.

An nn.Module gets forward pre-hooks in place (the caller keeps serving the same object): one on the root marks the
request's start and which of its layers are observed (drawn per layer: `ServingTaps.per_layer`), one per BatchNorm the
recognizers find reads its input when its layer is drawn, a forward hook on the root marks the end. A layer not drawn
costs its hook one thread-local read. An ExportedProgram is served as
its `module()` with a `tap` call inserted before each batch-norm op of the graph (the program itself is untouched).
A sampled layer input costs two reductions in its dtype, the per-channel sum and the per-channel 2-norm (squared into
the sum of squares), handed to the collector as small tensors; the float64 moments and the merge happen on the
collector's worker thread. (torch.var_mean over dims (0, 2, 3) was the obvious single call, and ran about ten times
slower than these two on CPU: 80 ms against 8 ms for the 53 BatchNorm inputs of a ResNet-50 at batch 1, one thread.)
"""

from __future__ import annotations

import inspect
import itertools
import threading
from typing import Any

import torch

from schemas import UnsupportedObjectError
from schemas.kinds import KIND_INFO

from ..serving_taps import ServingTaps, TappedLayer, TapSink

BATCH = KIND_INFO["batch"]
_NARROW = (torch.float16, torch.bfloat16)

#: sink id -> sink, for the taps inserted into program graphs (a graph can only name importable functions and constants).
_SINKS: dict[int, TapSink] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def _observe(sink: TapSink, index: int, x: torch.Tensor) -> None:
    try:
        x = x.detach()
        dims = [d for d in range(x.ndim) if d != 1]
        wide = torch.float32 if x.dtype in _NARROW else None  # float16 sums of squares overflow at 65504, bfloat16 ones keep 8 bits
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


def _root_hooks(root: torch.nn.Module, sink: TapSink) -> list:
    def starts(_module, args) -> None:  # a pre-hook returning anything but None would replace the arguments
        if sink.begin():
            sink.keep(args)

    def ends(_module, _args, _out) -> None:
        sink.end()

    return [root.register_forward_pre_hook(starts), root.register_forward_hook(ends)]


def module_taps(model: torch.nn.Module, refs: list, sink: TapSink) -> ServingTaps:
    """Hooks on `model` itself for every BatchNorm in `refs` (NormLayerRef of kind batch with running statistics)."""
    layers, handles = [], []
    for index, ref in enumerate(refs):
        module = ref.obj
        layers.append(_layer(ref.path, module.running_mean, module.running_var, module.eps))

        def hook(_module, args, index=index):
            if sink.observing(index):
                _observe(sink, index, args[0])

        handles.append(module.register_forward_pre_hook(hook))
    handles += _root_hooks(model, sink)

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return ServingTaps(model, layers, remove, _argument_names(model.forward), per_layer=True)


def program_taps(program: Any, sink: TapSink) -> ServingTaps:
    """`program.module()` with a `tap` before every batch-norm op that reads running statistics."""
    from torch.fx.operator_schemas import normalize_function

    module = program.module()
    graph = module.graph
    with _lock:
        sink_id = next(_ids)
        _SINKS[sink_id] = sink
    layers = []
    for node in list(graph.nodes):
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None or schema.name not in BATCH.aten_ops:
            continue
        bound = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
        kwargs = bound.kwargs if bound is not None else {}
        mean_node, var_node = kwargs.get("running_mean"), kwargs.get("running_var")
        if not all(isinstance(n, torch.fx.Node) and n.op == "get_attr" for n in (mean_node, var_node)):
            continue
        name = str(mean_node.target).removesuffix(".running_mean")
        layers.append(_layer(name, module.get_buffer(str(mean_node.target)), module.get_buffer(str(var_node.target)), kwargs.get("eps", 1e-5)))
        with graph.inserting_before(node):
            graph.call_function(tap, (kwargs["input"], sink_id, len(layers) - 1))
    if not layers:
        raise UnsupportedObjectError("the ExportedProgram has no batch-norm op reading running statistics to monitor.")
    module.recompile()
    handles = _root_hooks(module, sink)

    def remove() -> None:
        for handle in handles:
            handle.remove()
        _SINKS.pop(sink_id, None)

    return ServingTaps(module, layers, remove, _argument_names(module.forward), per_layer=True)


__all__ = ["module_taps", "program_taps", "tap"]
