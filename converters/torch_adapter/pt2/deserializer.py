"""torch's own `ExportedProgramDeserializer`, with the fake tensor of a static tensor value built directly.

Why: torch's `GraphModuleDeserializer.deserialize_tensor_meta` makes every node's meta["val"] with `torch.empty_strided`
under FakeTensorMode, whose dispatch (cache key, ShapeEnv guard suppression, cache entry) cost a third of reading a
decoder's `.pt2`. For a value whose sizes and strides are all plain ints on the CPU, with no mode active, this builds
the FakeTensor exactly as the mode itself does on a cache hit (`FakeTensorMode._get_output_tensor_from_cache_entry`): a
meta `empty_strided` wrapped as `FakeTensor(mode, meta, device)`. Symbolic sizes, other devices and anything unusual
take torch's path. tests/converters/test_pt2_reading.py holds the result equal to torch's.

The deserializer also wraps its graph in a GraphModule that `ExportedProgram.__init__` only takes attributes and meta
from, then generates and compiles the code again for its own GraphModule, the one the program keeps. Neither is written
while the program is read (together a fifth of reading a decoder, which a registration never runs): the graph answers
`python_code` with a stub until the program is built (`_Unwritten`), and the program's GraphModule then writes its code
the first time anything asks for it (its `forward`, `code`, `_code`, `str`, a pickle or copy: `_defer_code`), through
its own `recompile`, so it is the code torch writes. Only that module's own class (GraphModule makes one per instance)
carries the deferral; nothing of torch changes for other modules.

After building the graph, torch's `deserialize_graph` looks for unbacked symbols in every node's value, walking each
fake tensor's sizes, strides and offset: 0.4 ms per RMSNorm of a decoder. With none pending (none allocated, as in every
static program, or all bound already) that walk can find nothing, so a value made only of FakeTensors and plain scalars
is given no bindings without it (`_unbacked_bindings`); anything else is walked by torch.

torch's `ExportedProgramDeserializer.deserialize` runs as it is: its code is bound to a copy of its module's globals in
which `GraphModuleDeserializer` makes a torch instance carrying the three methods (`deserialize_graph` likewise bound to
a copy of its globals in which `symbolic_shapes` is `_SymbolicShapes`), so nothing of torch changes for other
callers or threads (the class is final: it cannot be subclassed). Should a later torch keep that first GraphModule, the
program is read again by torch's own path.

Every private torch name this reaches is in torch_internals, and every step falls back to torch's own on any exception,
with one debug line: the whole program to `ExportedProgramDeserializer().deserialize` as torch ships it, a tensor meta
to torch's `deserialize_tensor_meta`, the unbacked-symbol shortcut to torch's walk, the deferred code to `recompile`.
tests/converters/test_torch_internals.py makes each fast step fail and holds the result equal to the fast path's.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import torch
from torch.fx.experimental import symbolic_shapes
from torch.fx.graph import PythonCode

from .. import torch_internals as internals
from .program_schema import union_fields as _fields

_LOG = logging.getLogger(__name__)
_GLOBAL = "GraphModuleDeserializer"


def deserialize(serialized: Any, state_dict: dict, constants: dict) -> Any:
    """`ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, None)`, faster; torch's own when
    the faster path fails or builds the program differently (for a malformed program torch's then raises its own
    error)."""
    try:
        program = quick_deserialize(serialized, state_dict, constants)
        if unwritten_code(program):
            raise LookupError("a GraphModule kept the stub's code")
        return program
    except Exception as error:
        internals.fell_back(_LOG, "the program's deserialization", error)
    return torch_deserialize(serialized, state_dict, constants)


def torch_deserialize(serialized: Any, state_dict: dict, constants: dict) -> Any:
    """The program as torch's own ExportedProgramDeserializer builds it, unpatched."""
    return internals.exported_program_deserializer()().deserialize(serialized, state_dict, constants, None)


def quick_deserialize(serialized: Any, state_dict: dict, constants: dict) -> Any:
    """torch's ExportedProgramDeserializer.deserialize with the faster GraphModuleDeserializer (raising where this
    torch's deserializer is not the one it patches)."""
    deserializer = internals.exported_program_deserializer()
    bound = internals.with_globals(deserializer.deserialize, **{_GLOBAL: _graph_module_deserializer})
    program = bound(deserializer(), serialized, state_dict, constants, None)
    vars(program.graph).pop("python_code", None)  # the graph writes its code again
    internals.defer_code(program.graph_module, _LOG)
    return program


def unwritten_code(program: Any) -> bool:
    """Whether a GraphModule of the program kept the stub's code (a torch that builds it differently)."""
    return any(_UNWRITTEN in internals.stored_code(module) for module in program.graph_module.modules())


def _graph_module_deserializer() -> Any:
    """torch's GraphModuleDeserializer whose deserialize_tensor_meta tries `static_fake` first and whose graph answers
    `python_code` with `_Unwritten` from the module call graph (read last) on."""
    deserializer = internals.graph_module_deserializer()()
    torch_tensor_meta, torch_call_graph = (
        deserializer.deserialize_tensor_meta,
        deserializer.deserialize_module_call_graph,
    )

    def deserialize_tensor_meta(tensor_meta: Any) -> Any:
        try:
            fake = static_fake(deserializer.fake_tensor_mode, tensor_meta)
        except Exception as error:
            internals.fell_back(_LOG, "a static fake tensor", error)
            fake = None
        return torch_tensor_meta(tensor_meta) if fake is None else fake

    def deserialize_module_call_graph(module_call_graph: Any) -> Any:
        entries = torch_call_graph(module_call_graph)
        deserializer.graph.python_code = _Unwritten()
        return entries

    deserializer.deserialize_tensor_meta = deserialize_tensor_meta
    deserializer.deserialize_module_call_graph = deserialize_module_call_graph
    try:
        graph_function = internals.with_globals(type(deserializer).deserialize_graph, symbolic_shapes=_SymbolicShapes())
    except Exception as error:  # the graph is built by torch's own deserialize_graph, walking for unbacked symbols
        internals.fell_back(_LOG, "the unbacked-symbol shortcut", error)
    else:
        deserializer.deserialize_graph = types.MethodType(graph_function, deserializer)
    return deserializer


class _SymbolicShapes:
    """torch.fx.experimental.symbolic_shapes as `deserialize_graph` sees it: every attribute is the module's, but
    `_free_unbacked_symbols_with_path` is `_unbacked_bindings`."""

    def __getattr__(self, name: str) -> Any:
        return _unbacked_bindings if name == "_free_unbacked_symbols_with_path" else getattr(symbolic_shapes, name)


def _unbacked_bindings(value: Any, path: tuple, *args: Any, pending: Any = None, **kwargs: Any) -> dict:
    """torch's `_free_unbacked_symbols_with_path`, answered without its walk when no symbol is pending and `value` is
    FakeTensors and plain scalars only: every binding it records is a pending symbol's, so it finds none."""
    try:
        if not pending and _plain(value):
            return {}
    except Exception as error:
        internals.fell_back(_LOG, "the unbacked-symbol shortcut", error)
    return internals.free_unbacked_symbols_with_path(value, path, *args, pending=pending, **kwargs)


def _plain(value: Any) -> bool:
    """Whether `value` is a FakeTensor (exactly: no subclass, no functorch wrapper), an int, float, bool or None, or a
    tuple or list of those."""
    kind = type(value)
    if kind in (int, float, bool, type(None)) or internals.is_fake_tensor(value):
        return True
    return kind in (tuple, list) and all(_plain(item) for item in value)


_UNWRITTEN = "normbridge: code never written"


class _Unwritten:
    """The top graph's `python_code` while the program is built: a forward that refuses to run (never called: the
    program's GraphModule writes its real code before anything runs it)."""

    def __call__(self, root_module: str, **options: Any) -> PythonCode:
        return PythonCode(
            src=f"\n\ndef forward(self, *args, **kwargs):\n    raise RuntimeError({_UNWRITTEN!r})\n",
            globals={},
            _lineno_map=None,
        )


def static_fake(mode: Any, tensor_meta: Any) -> Any:
    """The FakeTensor torch makes of `tensor_meta` in `mode`, or None when torch's own path must make it (a symbolic
    size or stride, a device other than the CPU, a torch function or dispatch mode active)."""
    sizes, strides = _ints(tensor_meta.sizes), _ints(tensor_meta.strides)
    if sizes is None or strides is None or tensor_meta.device.type != "cpu":
        return None
    if internals.modes_active():
        return None
    dtype = internals.serialized_dtypes()[tensor_meta.dtype]
    empty = torch.empty_strided(sizes, strides, dtype=dtype, device="meta", requires_grad=tensor_meta.requires_grad)
    device = tensor_meta.device  # as torch's deserialize_device makes it
    return internals.fake_tensor(
        mode, empty, torch.device(device.type) if device.index is None else torch.device(device.type, device.index)
    )


def _ints(values: Any) -> tuple[int, ...] | None:
    """The plain ints of a list of serialized SymInts, or None when one is an expression (or not an int)."""
    found = []
    for value in values:
        fields = _fields(value, "__dict__")
        tag, number = fields.get("_type"), fields.get("as_int")
        if not isinstance(tag, str) or str(tag) != "as_int" or type(number) is not int:
            return None
        found.append(number)
    return tuple(found)


__all__ = ["deserialize", "quick_deserialize", "static_fake", "torch_deserialize", "unwritten_code"]
