"""What a `.pt2` program (models/model.json) may say before torch turns it into Python.

torch's deserializer trusts the JSON: it hands `expr_str` to `sympy.sympify` (which calls
`eval`), embeds node, input and attribute names in the source code FX generates and `exec`s,
`exec`s `guards_code` when `ExportedProgram.module()` is built with example inputs, and resolves a
node's `target` by walking attributes from `torch` (so `torch.os.system` is a valid target). An
ATen operator can touch files (`aten::from_file(shared=True)` creates one, `aten::save` writes
one). `check_program` therefore walks the whole document first and refuses anything outside a
strict vocabulary: names are identifiers, attribute paths are dotted words, expressions are
sympy arithmetic over symbols whose numbers stay small (`expressions`, `magnitudes`), operators are ATen/prims
operators (minus the file ones), a few control-flow higher-order operators or the symbolic-shape arithmetic torch itself
emits, and every integer is at most MAX_INTEGER in size (torch gives a symbol its hint and range bounds, and sympy
computes with them).
`check_graph` re-checks the graph torch built, in case a string resolved to something else.
"""

from __future__ import annotations

import functools
import json
import keyword
import math
import operator
import re
from typing import Any

from schemas import InputFileError

from .. import torch_internals
from . import opaque_operators
from .expressions import RUNS_CODE, expression_problem
from .magnitudes import SYMBOL_BITS

#: ATen operators that open, create or write files: a graph node calling one would touch the disk.
FILE_OPERATORS = frozenset({"aten.from_file", "aten.save"})

#: Higher-order operators torch.export emits for control flow, grad/autocast regions and effects.
HIGHER_ORDER_OPERATORS = frozenset(
    {
        "cond",
        "while_loop",
        "map_impl",
        "scan",
        "wrap_with_set_grad_enabled",
        "wrap_with_autocast",
        "auto_functionalized",
        "auto_functionalized_v2",
        "with_effects",
        "invoke_subgraph",
    }
)

#: Python callables a serialized graph may name: the symbolic-shape arithmetic of torch's serializer.
PYTHON_CALLABLES = (
    operator.getitem,
    operator.eq,
    operator.ne,
    operator.le,
    operator.ge,
    operator.lt,
    operator.gt,
    operator.neg,
    operator.pos,
    operator.mul,
    operator.add,
    operator.sub,
    operator.floordiv,
    operator.mod,
    operator.pow,
    operator.truediv,
    operator.and_,
    operator.or_,
    operator.lshift,
    operator.rshift,
    math.trunc,
)
_TORCH_SYM_CALLABLES = ("sym_not", "sym_int", "sym_float", "sym_ite", "sym_max", "sym_min", "sym_sqrt")

_OPERATOR_TARGET = re.compile(r"torch\.ops\.(aten|prims)\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)")
_HIGHER_ORDER_TARGET = re.compile(r"torch\.ops\.higher_order\.([A-Za-z_]\w*)")
#: The largest integer (in size) a program may hold: sizes, strides, hints and range bounds are int64 (2**64 leaves room
#: for an unsigned one); the bound the expression sizes of magnitudes.py count a symbol at.
MAX_INTEGER = 2**SYMBOL_BITS
_FQN = re.compile(r"[\w\-]+(\.[\w\-]+)*(@[0-9]+)?")

#: The containers torch's deserializer iterates without looking (a number there failed inside torch): path -> kind.
CONTAINERS = {
    "graph_module.graph": dict,
    "graph_module.graph.inputs": list,
    "graph_module.graph.outputs": list,
    "graph_module.graph.nodes": list,
    "graph_module.graph.tensor_values": dict,
    "graph_module.graph.sym_int_values": dict,
    "graph_module.graph.sym_bool_values": dict,
    "graph_module.graph.sym_float_values": dict,
    "graph_module.graph.custom_obj_values": dict,
    "graph_module.signature": dict,
    "graph_module.signature.input_specs": list,
    "graph_module.signature.output_specs": list,
    "graph_module.module_call_graph": list,
    "range_constraints": dict,
    "opset_version": dict,
    "schema_version": dict,
    "verifiers": list,
}
_NAME_KEYS = frozenset({"name", "as_name"})
_VALUE_MAPS = frozenset({"tensor_values", "sym_int_values", "sym_bool_values", "sym_float_values"})
_FQN_KEYS = frozenset({"parameter_name", "buffer_name", "tensor_constant_name", "user_input_name", "fqn"})
_IDENTIFIER_LISTS = frozenset({"forward_arg_names", "field_names"})
_CUSTOM_OBJECT_KEYS = frozenset({"as_custom_obj", "custom_obj", "custom_obj_name", "class_fqn"})
_OPERATOR_KEYS = frozenset({"target", "as_operator"})
_EXPRESSION_KEYS = frozenset({"expr_str"})
_RULE_KEYS = (
    _CUSTOM_OBJECT_KEYS | _NAME_KEYS | _FQN_KEYS | _OPERATOR_KEYS | _EXPRESSION_KEYS
)  # the keys _check_entry has a rule for


@functools.cache
def python_callables() -> dict[Any, str]:
    """{callable: serialized name} for the Python functions a graph may call (torch's naming rule)."""
    import torch

    found = list(PYTHON_CALLABLES) + [getattr(torch, name) for name in _TORCH_SYM_CALLABLES]
    return {fn: f"{fn.__module__}.{fn.__name__}" for fn in found}


def is_identifier(text: Any) -> bool:
    return isinstance(text, str) and text.isidentifier() and not keyword.iskeyword(text)


def is_fqn(text: Any, key: str) -> bool:
    """A dotted attribute path of words (digits and '-' allowed, as nn.ModuleDict keys); '' for the root call."""
    return isinstance(text, str) and (bool(_FQN.fullmatch(text)) or (key == "fqn" and text == ""))


def operator_problem(target: Any) -> str | None:
    """Why a serialized operator name may not be run, or None when it may."""
    if not isinstance(target, str):
        return "is not a string"
    if match := _OPERATOR_TARGET.fullmatch(target):
        packet = f"{match.group(1)}.{match.group(2)}"
        return f"is '{packet}', which reads or writes files" if packet in FILE_OPERATORS else None
    if match := _HIGHER_ORDER_TARGET.fullmatch(target):
        return (
            None if match.group(1) in HIGHER_ORDER_OPERATORS else "is a higher-order operator normbridge does not run"
        )
    if target in python_callables().values() or target == opaque_operators.TARGET:
        return None
    return "is not an ATen or prims operator"


def check_program(document: Any, where: str) -> None:
    """Refuse a serialized ExportedProgram (parsed JSON) that could make torch run code it does not hold as operators.

    Raises:
        InputFileError: naming `where` (file and entry), the key and the value that was refused.
    """
    if not isinstance(document, dict) or not isinstance(document.get("graph_module"), dict):
        raise InputFileError(
            f"{where} is not a serialized torch.export program (no 'graph_module'); re-save the model with torch.export.save."
        )
    guards = document.get("guards_code", [])
    if not isinstance(guards, list):
        _refuse(where, "guards_code", guards, "is not a list")
    _check_containers(document, where)
    opaque_operators.replace_custom_operators(document, where)  # a library's operator: a stand-in that is never run
    for guard in guards:
        if problem := expression_problem(guard, guard=True):
            _refuse(where, "guards_code", guard, *problem)
    _walk(document, where, key="")


def _check_containers(document: dict, where: str) -> None:
    """Each of CONTAINERS, when present, is the kind of container torch.export.save writes there."""
    for path, kind in CONTAINERS.items():
        value: Any = document
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None and not isinstance(value, kind):
            raise InputFileError(
                f"{where}: '{path}' is {json.dumps(value)[:80]}, where torch.export.save writes a "
                f"{'list' if kind is list else 'JSON object'}; the file was altered: re-export the model with "
                "torch.export.export and torch.export.save."
            )


def _walk(value: Any, where: str, key: str) -> None:
    """Depth first in document order (the first problem found is the one named); scalars are checked by their key, and
    integers by their size, not visited."""
    if isinstance(value, dict):
        if key in _VALUE_MAPS or key == "custom_obj_values":
            if key == "custom_obj_values" and value:
                _refuse(where, key, next(iter(value)), "is a TorchScript custom object, which is loaded by a pickle")
            for name in value:
                if not is_identifier(name):
                    _refuse(where, key, name, "is not a Python identifier")
        for child_key, child in value.items():
            if child_key in _RULE_KEYS:
                _check_entry(where, child_key, child)
            if isinstance(child, (dict, list)):
                _walk(child, where, child_key)
            elif type(child) is int and not -MAX_INTEGER <= child <= MAX_INTEGER:
                _refuse_integer(where, child_key, child)
    elif isinstance(value, list):
        if key in _IDENTIFIER_LISTS:
            for name in value:
                if not is_identifier(name):
                    _refuse(where, key, name, "is not a Python identifier")
        for child in value:
            if isinstance(child, (dict, list)):
                _walk(child, where, key)
            elif type(child) is int and not -MAX_INTEGER <= child <= MAX_INTEGER:
                _refuse_integer(where, key, child)


def _check_entry(where: str, key: str, value: Any) -> None:
    """The rule for one key of the document (keys without a rule carry data torch never evaluates; a rule's key belongs
    in _RULE_KEYS, which `_walk` asks before calling this)."""
    if key in _CUSTOM_OBJECT_KEYS:
        _refuse(where, key, value, "is a TorchScript custom object, which is loaded by a pickle")
    if key in _NAME_KEYS and value not in (None, "") and not is_identifier(value):  # '' names a positional argument
        _refuse(where, key, value, "is not a Python identifier")
    elif key in _FQN_KEYS and not is_fqn(value, key):
        _refuse(where, key, value, "is not a dotted attribute path")
    elif key in _OPERATOR_KEYS and (problem := operator_problem(value)):
        _refuse(where, key, value, problem)
    elif key in _EXPRESSION_KEYS and (problem := expression_problem(value, guard=False)):
        _refuse(where, key, value, *problem)


def check_graph(program: Any, where: str) -> None:
    """Refuse a deserialized ExportedProgram whose graphs call anything but the allowed operators (defence in depth)."""
    import torch

    allowed_python = set(python_callables())
    modules = [m for m in program.graph_module.modules() if isinstance(m, torch.fx.GraphModule)]
    for module in modules:
        for node in module.graph.nodes:
            if node.op not in ("placeholder", "get_attr", "call_function", "output"):
                _refuse(where, "node", node.name, f"is a '{node.op}' node, which torch.export never writes")
            if not is_identifier(node.name):
                _refuse(where, "node", node.name, "is not a Python identifier")
            if node.op == "call_function":
                _check_callable(node.target, node.name, where, allowed_python)
            for leaf in torch_internals.tree_leaves((node.args, node.kwargs)):
                if callable(leaf) and not isinstance(leaf, torch.fx.Node):
                    _check_callable(leaf, node.name, where, allowed_python)


def _check_callable(target: Any, node: str, where: str, allowed_python: set) -> None:
    if isinstance(target, torch_internals.op_overload_class()):
        packet = f"{target.namespace}.{torch_internals.op_name(target).split('::')[-1]}"
        if target.namespace in ("aten", "prims") and packet not in FILE_OPERATORS:
            return
        if packet == "normbridge.opaque_operator":
            return
    elif isinstance(target, torch_internals.higher_order_operator_class()):
        if target.name() in HIGHER_ORDER_OPERATORS:
            return
    elif any(target is fn for fn in allowed_python):
        return
    _refuse(
        where,
        f"node '{node}'",
        getattr(target, "__name__", repr(target)),
        "calls something that is not an allowed ATen operator",
    )


def _refuse_integer(where: str, key: str, value: int) -> None:
    raise InputFileError(
        f"{where}: '{key}' holds an integer of {value.bit_length()} bits, more than the {SYMBOL_BITS} any size, stride, "
        "hint or range bound can need (torch's shape arithmetic computes with it); normbridge refuses the file: "
        "re-export the model with torch.export.export and torch.export.save."
    )


def _refuse(where: str, key: str, value: Any, problem: str, consequence: str = RUNS_CODE) -> None:
    shown = repr(value) if len(repr(value)) <= 120 else repr(value)[:117] + "..."
    raise InputFileError(
        f"{where}: '{key}' {shown} {problem}, and {consequence}; normbridge refuses the file: "
        "re-export the model with torch.export.export and torch.export.save from code you trust."
    )
