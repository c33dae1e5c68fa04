"""The aten ops one module runs, cut out of an ExportedProgram, and a way to run them on their own.

`torch.export` keeps, on every node, the stack of modules that produced it (`nn_module_stack`);
the nodes whose stack names a module are what that module computes. `group_of` turns them into
a `NodeGroup` (one data input, one output, the parameters and buffers read), and `runner` copies
them into a standalone fx graph, so a `.pt2` module's normalization is proved on a probe like a
live module's.
"""

from __future__ import annotations

from typing import Any

import torch

from ..torch_internals import op_name
from .norm_graph import IGNORED, NodeGroup, NotANormalization, strip


def state_names(program: Any) -> dict[str, str]:
    """Placeholder name -> state_dict / constants key."""
    signature = program.graph_signature
    return {
        **signature.inputs_to_parameters,
        **signature.inputs_to_buffers,
        **getattr(signature, "inputs_to_lifted_tensor_constants", {}),
    }


def state_tensor(program: Any, key: str) -> torch.Tensor:
    return program.state_dict[key] if key in program.state_dict else program.constants[key]


def module_paths(node: Any) -> list[tuple[str, str]]:
    """(path, class name) of every module on `node`'s nn_module_stack, outermost first."""
    stack = node.meta.get("nn_module_stack") if hasattr(node, "meta") else None
    out = []
    for path, type_name in (stack or {}).values():
        type_name = type_name if isinstance(type_name, str) else getattr(type_name, "__qualname__", str(type_name))
        out.append((path, type_name.rsplit(".", 1)[-1]))
    return out


def class_path_of(nodes: list, path: str) -> str | None:
    """The import path nn_module_stack records for the module at `path` ('transformers.models....LlamaRMSNorm'),
    or None."""
    for node in nodes:
        stack = node.meta.get("nn_module_stack") if hasattr(node, "meta") else None
        for module_path, type_name in (stack or {}).values():
            if module_path == path:
                name = type_name if isinstance(type_name, str) else f"{type_name.__module__}.{type_name.__qualname__}"
                return name if "." in name and "<" not in name else None
    return None


def group_of(program: Any, nodes: list, prefix: str = "", names: dict[str, str] | None = None) -> NodeGroup:
    """The NodeGroup of `nodes` (graph order); state names are relative to `prefix` (the module's path). `names`: the
    program's state_names, when the caller has them."""
    names = state_names(program) if names is None else names
    members = set(nodes)
    data, state = [], {}
    for node in nodes:
        for arg in _tensor_args(node):
            if arg in members:
                continue
            key = names.get(arg.name) if arg.op == "placeholder" else None
            if key is not None:
                state[arg] = key[len(prefix) + 1 :] if prefix and key.startswith(prefix + ".") else key
            elif arg not in data:
                data.append(arg)
    # A no-op cast of the input (`x.to(float32)` on a float32 x) is the input itself: torch.export hands that alias to
    # the caller's other uses of x (LlamaRMSNorm's residual; Mamba's `residual.to(float32)`, where x is itself the
    # block's cast), which does not make it an output of the module. Followed back only through the module's own nodes:
    # past its input, the walk would never meet it.
    outputs = [
        n
        for n in nodes
        if op_name(n) not in IGNORED and any(u not in members for u in n.users) and strip(n, members) not in data
    ]
    if len(data) != 1 or len(outputs) != 1:
        raise NotANormalization(f"it takes {len(data)} tensor inputs and gives {len(outputs)} outputs, not one of each")
    return NodeGroup(nodes=list(nodes), x=data[0], out=outputs[0], state=state)


def whole_program_group(program: Any) -> NodeGroup:
    """The NodeGroup of a program exported from one module on one input."""
    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    return group_of(program, nodes)


def _tensor_args(node: Any) -> list:
    found = []

    def visit(value):
        if isinstance(value, torch.fx.Node):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)

    visit(node.args)
    visit(node.kwargs)
    return found


def runner(group: NodeGroup):
    """A function (x, state tensors by placeholder) -> output that runs the group's ops alone."""
    graph = torch.fx.Graph()
    mapping: dict = {group.x: graph.placeholder("x")}
    order = list(group.state)
    for i, node in enumerate(order):
        mapping[node] = graph.placeholder(f"state_{i}")
    for node in group.nodes:
        mapping[node] = graph.node_copy(node, lambda n: mapping[n])
    graph.output(mapping[group.out])
    module = torch.fx.GraphModule(torch.nn.Module(), graph)

    def run(x: torch.Tensor, tensors: dict) -> torch.Tensor:
        with torch.no_grad():
            return module(x, *(tensors[node] for node in order))

    return run
