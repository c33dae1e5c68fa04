"""Many single-layer models run as one: one graph holding each model's nodes and initializers, one session, one run.

Why: a session costs about a millisecond to build and the run a few microseconds, so a check of a model's
160 RMSNorms spent its ONNX leg building sessions. Each model is copied into the merged graph as written
(every node, attribute and initializer, names prefixed so they stay apart), all read the one shared probe
input, and each model's outputs are fetched under their prefixed names: every value is computed by the same
kernel on the same input and state as in the model's own session (tests/converters/gate/test_grouped_check.py
compares them bit for bit). Models this cannot hold as written (subgraphs, local functions, sparse
initializers, other opsets or inputs) are left out, and the caller runs them on their own.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .framework import Run, refuse_unrunnable, session

#: The merged graph's one data input.
SHARED_INPUT = "normbridge.probe"


def mergeable(runs: Sequence[Run]) -> bool:
    """Whether one graph can hold every run's model as written, all fed the same input."""
    first = runs[0]
    opsets = sorted((o.domain, o.version) for o in first.model.opset_import)
    input_type = _data_input(first).type
    for run in runs:
        graph = run.model.graph
        if (
            run.model.functions
            or graph.sparse_initializer
            or sorted((o.domain, o.version) for o in run.model.opset_import) != opsets
        ):
            return False
        if any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for node in graph.node
            for a in node.attribute
        ):
            return False
        if _data_input(run).type != input_type or run.layer.dtype != first.layer.dtype:
            return False
    return not _stepped_state_shared(runs)


def _stepped_state_shared(runs: Sequence[Run]) -> bool:
    """Whether a running statistic a node steps in training mode holds the same type, shape and values as an initializer
    of another run's model.

    Why: onnxruntime's common-subexpression pass then feeds both models' nodes one value (the float32 Cast it inserts
    before a float16 BatchNormalization, say), and a BatchNormalization in training mode writes its moved running
    statistics into the buffer it read them from: the second model stepped from the first one's moved statistics
    (onnxruntime 1.32, two float16 BatchNorms of equal state, as every never-trained layer has).
    Such models run alone."""
    stepped_by_run = [
        {
            name
            for node in run.model.graph.node
            if any(a.name == "training_mode" and a.i == 1 for a in node.attribute)
            for name in node.input[3:5]
        }
        for run in runs
    ]
    if not any(stepped_by_run):
        return False  # no node steps a statistic (every eval run): no initializer's values need reading
    owners: dict[tuple, set[int]] = {}
    stepped: set[tuple] = set()
    for index, (run, statistics) in enumerate(zip(runs, stepped_by_run)):
        graph = run.model.graph
        for tensor in graph.initializer:
            key = (tensor.data_type, tuple(tensor.dims), numpy_helper.to_array(tensor).tobytes())
            owners.setdefault(key, set()).add(index)
            if tensor.name in statistics:
                stepped.add(key)
    return any(len(owners[key]) > 1 for key in stepped)


def _data_input(run: Run) -> onnx.ValueInfoProto:
    return next(value for value in run.model.graph.input if value.name == run.layer.input_name)


def merged_model(runs: Sequence[Run]) -> tuple[onnx.ModelProto, list[list[str]]]:
    """(one model holding every run's graph, each run's output names in it); `mergeable(runs)` must hold."""
    nodes, initializers, outputs, fetched = [], [], [], []
    for index, run in enumerate(runs):
        graph = run.model.graph

        def renamed(name: str, prefix: str = f"m{index}:", data: str = run.layer.input_name) -> str:
            return name if name == "" else SHARED_INPUT if name == data else prefix + name

        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [renamed(name) for name in node.input]
            copy.output[:] = [renamed(name) for name in node.output]
            copy.name = f"m{index}:{node.name}" if node.name else ""
            nodes.append(copy)
        for tensor in graph.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(tensor)
            copy.name = renamed(tensor.name)
            initializers.append(copy)
        names = run.outputs if run.outputs is not None else [value.name for value in graph.output]
        for value in graph.output:
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(value)
            copy.name = renamed(value.name)
            outputs.append(copy)
        fetched.append([renamed(name) for name in names])
    shared = onnx.ValueInfoProto()
    shared.CopyFrom(_data_input(runs[0]))
    shared.name = SHARED_INPUT
    graph = helper.make_graph(nodes, "normbridge.merged", [shared], outputs, initializer=initializers)
    first = runs[0].model
    model = helper.make_model(graph, opset_imports=list(first.opset_import), producer_name="normbridge")
    model.ir_version = max(run.model.ir_version for run in runs)
    return model, fetched


def run_merged(runs: Sequence[Run], x: np.ndarray) -> list:
    """Each run's result (as `execute` returns it) from one session over the merged graph; raises what building or
    running it raises (the caller then runs each model on its own, where each raises its own error)."""
    for run in runs:
        refuse_unrunnable(run.layer)
    model, fetched = merged_model(runs)
    names = [name for names in fetched for name in names]
    values = dict(zip(names, session(model).run(names, {SHARED_INPUT: np.asarray(x, dtype=runs[0].layer.dtype)})))
    return [run.result([values[name] for name in names]) for run, names in zip(runs, fetched)]
