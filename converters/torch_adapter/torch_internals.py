"""Every use of torch's private modules and attributes, one function each, so a torch that renames one fails here,
by name.

normbridge reads `.pt2` files safely and faster than torch.export.load by handing torch's deserializer checked parts and
replacing a few of its steps with quicker ones (pt2/program_schema.py, pt2/deserializer.py). Those parts are private to
torch and change between releases. Each function below reaches one of them; its docstring says what it reaches and what
replaces it when it fails: a speed path falls back, with one debug line, to the same step as torch ships it; a lookup
with a public equivalent falls back to that; a part nothing replaces raises MissingDependencyError naming this torch's
version, never a message that blames the file. tests/converters/test_torch_internals.py runs every access on the
installed torch and holds each fallback's result equal to its fast path's.
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any

from schemas.errors import MissingDependencyError

_LOG = logging.getLogger(__name__)

SERIALIZE = "torch._export.serde.serialize"
SCHEMA = "torch._export.serde.schema"
UNION = "torch._export.serde.union"
#: The logger torch's fake tensors report failed shape propagation to (computed.py quiets it while probing).
FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"

#: torch.export's serialized ScalarType numbers (torch/_export/serde/schema.py, fixed by the file format): the dtype
#: table used when torch's own `_SERIALIZE_TO_TORCH_DTYPE` cannot be reached.
SCALAR_TYPES = {
    1: "uint8",
    2: "int8",
    3: "int16",
    4: "int32",
    5: "int64",
    6: "float16",
    7: "float32",
    8: "float64",
    9: "complex32",
    10: "complex64",
    11: "complex128",
    12: "bool",
    13: "bfloat16",
    28: "uint16",
    29: "float8_e4m3fn",
    30: "float8_e5m2",
    31: "float8_e4m3fnuz",
    32: "float8_e5m2fnuz",
    33: "float8_e8m0fnu",
    34: "uint32",
    35: "uint64",
}


def torch_version() -> str:
    """This torch's release (`2.14.1` for `2.14.1+cu130`): the one reading of it, for provenance and messages."""
    import torch

    return torch.__version__.split("+")[0]


def fell_back(logger: logging.Logger, step: str, error: BaseException) -> None:
    """The one debug line a speed path logs when it takes torch's own path for `step`."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "%s: torch %s's own path taken (%s: %s)", step, torch_version(), type(error).__name__, _first_line(error)
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else ""


def _unavailable(what: str, purpose: str, error: BaseException) -> MissingDependencyError:
    return MissingDependencyError(
        f"torch {torch_version()} has no {what} ({type(error).__name__}), which normbridge needs {purpose}; install a torch in the "
        "range normbridge's pyproject.toml admits (pip install 'normbridge[torch]').",
        setting="torch",
    )


@functools.cache
def _private(module: str, name: str | None = None, purpose: str = "to read a .pt2 file") -> Any:
    """`module` (or its attribute `name`), or MissingDependencyError naming it."""
    try:
        found = importlib.import_module(module)
        return found if name is None else getattr(found, name)
    except (ImportError, AttributeError) as error:
        raise _unavailable(f"'{module}{'.' + name if name else ''}'", purpose, error) from error


# -- the program's JSON as torch's schema dataclasses (program_schema) -------------------------------------------------


def import_serializer() -> Any:
    """`torch._export.serde.serialize` (it imports torch._dynamo, about 2 s): imported ahead by a warm worker; nothing
    replaces it (reading a .pt2 needs it), so a failure raises MissingDependencyError."""
    return _private(SERIALIZE)


def schema_module() -> Any:
    """`torch._export.serde.schema`, whose dataclasses program_schema builds; on failure the caller converts with
    `dict_to_program` (torch's own `_dict_to_dataclass`)."""
    return _private(SCHEMA)


def resolve_schema_class(cls: Any) -> Any:
    """`torch._export.serde.serialize._resolve_schema_cls`: a forward reference as its schema class; on failure the
    caller converts with `dict_to_program`."""
    return _private(SERIALIZE, "_resolve_schema_cls")(cls)


def union_base() -> type:
    """`torch._export.serde.union._Union`, the base of the schema's tagged unions; on failure the caller converts with
    `dict_to_program`."""
    return _private(UNION, "_Union")


def union_tag(name: str, cls: type) -> Any:
    """`torch._export.serde.union._UnionTag.create(name, cls)`, the `_type` a union built by `create` holds; on failure
    the caller converts with `dict_to_program`."""
    return _private(UNION, "_UnionTag").create(name, cls)


def dict_to_program(document: Any) -> Any:
    """`torch._export.serde.serialize._dict_to_dataclass(schema.ExportedProgram, document)`: torch's own conversion, the
    path program_schema's faster one falls back to; nothing replaces it, so a failure raises MissingDependencyError."""
    return _private(SERIALIZE, "_dict_to_dataclass")(_private(SCHEMA, "ExportedProgram"), document)


def reader_schema_version() -> tuple[int, int]:
    """`torch._export.serde.schema.SCHEMA_VERSION`, the (major, minor) schema this torch writes and reads; on failure
    pt2/versions.py leaves the check to torch's deserializer (which refuses another major version)."""
    major, minor = _private(SCHEMA, "SCHEMA_VERSION")
    return int(major), int(minor)


# -- torch's deserializer and the steps pt2/deserializer.py replaces --------------------------------------------


def exported_program_deserializer() -> type:
    """`torch._export.serde.serialize.ExportedProgramDeserializer`: torch's own path for a whole program, which the
    patched one falls back to; nothing replaces it, so a failure raises MissingDependencyError."""
    return _private(SERIALIZE, "ExportedProgramDeserializer")


def graph_module_deserializer() -> type:
    """`torch._export.serde.serialize.GraphModuleDeserializer`, whose methods pt2/deserializer.py patches on one
    instance; on failure the program is read by `exported_program_deserializer` as torch ships it."""
    return _private(SERIALIZE, "GraphModuleDeserializer")


def with_globals(function: Any, **names: Any) -> Any:
    """A copy of torch's `function` run against a copy of its module's globals in which `names` are replaced; raises
    when `function` is not plain Python or does not read one of `names` (a torch whose code changed): the caller then
    runs torch's `function` itself."""
    import types

    if not isinstance(function, types.FunctionType):
        raise TypeError(f"{function!r} is not a Python function")
    unread = sorted(set(names) - set(function.__code__.co_names))
    if unread:
        raise LookupError(f"{function.__qualname__} no longer reads {', '.join(unread)}")
    namespace = dict(function.__globals__)
    namespace.update(names)
    bound = types.FunctionType(
        function.__code__, namespace, function.__name__, function.__defaults__, function.__closure__
    )
    bound.__kwdefaults__ = function.__kwdefaults__
    return bound


def free_unbacked_symbols_with_path(value: Any, path: tuple, *args: Any, **kwargs: Any) -> dict:
    """`torch.fx.experimental.symbolic_shapes._free_unbacked_symbols_with_path`: torch's walk for unbacked symbols,
    which the shortcut answers without when nothing is pending and falls back to otherwise; nothing replaces it."""
    return _private("torch.fx.experimental.symbolic_shapes", "_free_unbacked_symbols_with_path")(
        value, path, *args, **kwargs
    )


def fake_tensor(mode: Any, meta: Any, device: Any) -> Any:
    """`torch._subclasses.fake_tensor.FakeTensor(mode, meta, device)`, as FakeTensorMode wraps a cached result; on
    failure the tensor meta is read by torch's own `deserialize_tensor_meta`."""
    return _private("torch._subclasses.fake_tensor", "FakeTensor")(mode, meta, device)


def is_fake_tensor(value: Any) -> bool:
    """Whether `value` is exactly a `torch._subclasses.fake_tensor.FakeTensor` (no subclass); on failure the
    unbacked-symbol shortcut runs torch's walk (`free_unbacked_symbols_with_path`)."""
    return type(value) is _private("torch._subclasses.fake_tensor", "FakeTensor")


def modes_active() -> bool:
    """`torch._C._len_torch_dispatch_stack()` or `_len_torch_function_stack()`: whether a dispatch or function mode is
    active (a fake tensor is then made by torch's dispatch); True when it cannot be told, which takes torch's path."""
    import torch

    try:
        return bool(torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack())
    except Exception as error:
        fell_back(_LOG, "the active-mode check", error)
        return True


@functools.cache
def serialized_dtypes() -> dict[int, Any]:
    """`torch._export.serde.serialize._SERIALIZE_TO_TORCH_DTYPE` (serialized ScalarType number -> torch.dtype); on
    failure the file format's own numbering (SCALAR_TYPES), the dtypes this torch has."""
    import torch

    try:
        return {int(number): dtype for number, dtype in _private(SERIALIZE, "_SERIALIZE_TO_TORCH_DTYPE").items()}
    except Exception as error:
        fell_back(_LOG, "the serialized dtype table", error)
        return {number: getattr(torch, name) for number, name in SCALAR_TYPES.items() if hasattr(torch, name)}


def graph_module_own_class(module: Any) -> type:
    """The class GraphModule makes for `module` alone (`GraphModuleImpl`, torch/fx/graph_module.py), whose `forward`
    and `_code` pt2/deserializer.py defers; raises for any other class: the caller then writes the code at once
    (`recompile`)."""
    from torch.fx.graph_module import GraphModule

    cls = type(module)
    if not cls.__qualname__.endswith(".GraphModuleImpl") or cls.__bases__ != (GraphModule,) or "_code" in vars(cls):
        raise LookupError(f"{cls.__qualname__} is not a GraphModule's class of its own")
    return cls


def stored_code(module: Any) -> str:
    """The Python code a GraphModule holds written (its private `_code` attribute), "" when it holds none yet: read by
    pt2/deserializer.py to tell a module that kept the stub's code; nothing replaces it (a torch without it fails the
    check, and the program is then built by torch's own deserializer)."""
    return vars(module).get("_code", "")


def defer_code(module: Any, logger: logging.Logger) -> None:
    """Have `module` write its code when first asked for it instead of now: its `forward`, `_code` (which `code`, `str`
    and copying read) and pickling write it first, through `recompile`, whose own assignment of `_code` ends the
    deferral. Reaches GraphModule's private `_code` on the module's own class (`graph_module_own_class`); on failure the
    module writes its code now (`recompile`, the public path), which is what torch's deserializer does."""
    from torch.fx.graph_module import GraphModule

    try:
        cls = graph_module_own_class(module)
    except Exception as error:
        fell_back(logger, "the deferred code", error)
        module.recompile()
        return
    vars(module).pop("_code", None)
    cls._code = _DeferredCode()
    cls.forward = _DeferredForward()
    cls.__reduce__ = _written_first(GraphModule.__reduce__)  # both copy the module's attributes before they recompile
    cls.__reduce_package__ = _written_first(GraphModule.__reduce_package__)


class _DeferredForward:
    """The `forward` of a GraphModule whose code is not written yet: looking it up (to call it, or to read its
    signature) writes the code, whose `recompile` puts the real forward on the module's class in place of this."""

    def __get__(self, module: Any, owner: type) -> Any:
        if module is None:
            return self
        module.recompile()
        return vars(type(module))["forward"].__get__(module, owner)


def _written_first(method: Any) -> Any:
    """`method`, run once the module's code is written."""

    def written_first(self: Any, *args: Any) -> Any:
        self.recompile()
        return method(self, *args)

    written_first.deferral = True
    return written_first


class _DeferredCode:
    """The `_code` of a GraphModule whose code is not written yet: reading it writes it."""

    def __get__(self, module: Any, owner: type) -> Any:
        if module is None:
            return self
        module.recompile()  # its assignment of _code (below) ends the deferral
        return vars(module)["_code"]

    def __set__(self, module: Any, value: str) -> None:
        vars(module)["_code"] = value
        cls = type(module)
        if isinstance(vars(cls).get("_code"), _DeferredCode):
            del cls._code
        for name in ("__reduce__", "__reduce_package__"):
            if getattr(vars(cls).get(name), "deferral", False):
                delattr(cls, name)


# -- pytrees and operators ---------------------------------------------------------------------------------------------


def registered_pytree_types() -> frozenset[str] | None:
    """The serialized names of the pytree node types this process registered (`torch.utils._pytree.
    SERIALIZED_TYPE_TO_PYTHON_TYPE`); None when they cannot be read, and pt2/treespecs.py then rewrites nothing
    (torch's deserializer refuses a type it does not know)."""
    try:
        return frozenset(_private("torch.utils._pytree", "SERIALIZED_TYPE_TO_PYTHON_TYPE"))
    except Exception as error:
        fell_back(_LOG, "the registered pytree types", error)
        return None


def tree_leaves(value: Any) -> list:
    """`torch.utils._pytree.tree_leaves(value)`; on failure the public `torch.fx.node.map_aggregate` collects the leaves
    of a node's arguments (the containers FX arguments are made of; it also opens slices, whose parts are plain
    values)."""
    try:
        return _private("torch.utils._pytree", "tree_leaves")(value)
    except MissingDependencyError as error:
        fell_back(_LOG, "the leaves of a node's arguments", error)
    import torch.fx

    found: list = []
    torch.fx.node.map_aggregate(value, lambda leaf: found.append(leaf))
    return found


def tree_unflatten(leaves: list, spec: Any) -> Any:
    """`torch.utils._pytree.tree_unflatten(leaves, spec)`; on failure the spec's own `unflatten` (TreeSpec's method)."""
    try:
        unflatten = _private("torch.utils._pytree", "tree_unflatten")
    except MissingDependencyError as error:
        fell_back(_LOG, "the program's input structure", error)
        return spec.unflatten(leaves)
    return unflatten(leaves, spec)


@functools.cache
def op_overload_class() -> type:
    """`torch._ops.OpOverload`, the class of an ATen operator overload; on failure the class of the public
    `torch.ops.aten.add.Tensor`."""
    try:
        return _private("torch._ops", "OpOverload")
    except MissingDependencyError as error:
        fell_back(_LOG, "the operator overload class", error)
        import torch

        return type(torch.ops.aten.add.Tensor)


@functools.cache
def higher_order_operator_class() -> type:
    """`torch._ops.HigherOrderOperator`; on failure the class of that name among the bases of the public
    `torch.ops.higher_order.cond`."""
    try:
        return _private("torch._ops", "HigherOrderOperator")
    except MissingDependencyError as error:
        fell_back(_LOG, "the higher-order operator class", error)
        import torch

        return next(c for c in type(torch.ops.higher_order.cond).__mro__ if c.__name__ == "HigherOrderOperator")


def op_schema(target: Any) -> Any:
    """`target._schema`, the FunctionSchema (name, arguments) of an ATen operator overload; None for a target that is
    not one (a Python callable, a higher-order operator). No public path gives an operator's arguments: an overload
    without it raises MissingDependencyError rather than leaving every operator unread."""
    schema = getattr(target, "_schema", None)
    if schema is None and isinstance(target, op_overload_class()):
        raise _unavailable(
            f"'_schema' on its operator {target!r}",
            "to read the operators of a torch.export program",
            AttributeError("_schema"),
        )
    return schema


def op_name(call: Any) -> str | None:
    """The schema name (`aten::batch_norm`) of the ATen operator `call` is or calls: an operator overload, or a
    torch.fx node calling one; None for anything else (another node, a Python callable, a higher-order operator, a
    constant). Every reading of an operator's name goes through here (`op_schema`: what it reaches)."""
    if isinstance(call, _fx_node_class()):
        call = call.target if call.op == "call_function" else None
    schema = op_schema(call)
    return None if schema is None else schema.name


@functools.cache
def _fx_node_class() -> type:
    import torch.fx

    return torch.fx.Node


# -- modules and tensors -----------------------------------------------------------------------------------------------


@functools.cache
def norm_base_classes() -> tuple[type, ...]:
    """`torch.nn.modules.batchnorm._NormBase` (the base of BatchNorm and InstanceNorm);
    on failure their public classes."""
    import torch

    found = getattr(torch.nn.modules.batchnorm, "_NormBase", None)
    if isinstance(found, type):
        return (found,)
    fell_back(_LOG, "the BatchNorm/InstanceNorm base class", AttributeError("_NormBase"))
    nn = torch.nn
    return (
        nn.BatchNorm1d,
        nn.BatchNorm2d,
        nn.BatchNorm3d,
        nn.LazyBatchNorm1d,
        nn.LazyBatchNorm2d,
        nn.LazyBatchNorm3d,
        nn.SyncBatchNorm,
        nn.InstanceNorm1d,
        nn.InstanceNorm2d,
        nn.InstanceNorm3d,
        nn.LazyInstanceNorm1d,
        nn.LazyInstanceNorm2d,
        nn.LazyInstanceNorm3d,
    )


@functools.cache
def batch_norm_base_classes() -> tuple[type, ...]:
    """`torch.nn.modules.batchnorm._BatchNorm` (BatchNorm1d/2d/3d, their lazy forms, SyncBatchNorm);
    on failure those public classes."""
    import torch

    found = getattr(torch.nn.modules.batchnorm, "_BatchNorm", None)
    if isinstance(found, type):
        return (found,)
    fell_back(_LOG, "the BatchNorm base class", AttributeError("_BatchNorm"))
    nn = torch.nn
    return (
        nn.BatchNorm1d,
        nn.BatchNorm2d,
        nn.BatchNorm3d,
        nn.LazyBatchNorm1d,
        nn.LazyBatchNorm2d,
        nn.LazyBatchNorm3d,
        nn.SyncBatchNorm,
    )


@functools.cache
def dropout_base_classes() -> tuple[type, ...]:
    """`torch.nn.modules.dropout._DropoutNd` (every dropout module); on failure the public dropout classes."""
    import torch

    found = getattr(torch.nn.modules.dropout, "_DropoutNd", None)
    if isinstance(found, type):
        return (found,)
    fell_back(_LOG, "the dropout base class", AttributeError("_DropoutNd"))
    nn = torch.nn
    return (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def own_tensors(module: Any) -> list:
    """`module._parameters` and `module._buffers` values (its own tensors, read without the generators); on failure the
    public `parameters(recurse=False)` and `buffers(recurse=False)`."""
    try:
        return [t for t in (*module._parameters.values(), *module._buffers.values()) if t is not None]  # noqa: SLF001
    except AttributeError as error:
        fell_back(_LOG, "a module's own tensors", error)
        return list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))


def version_counter(tensor: Any) -> Any:
    """`tensor._version`, bumped by every in-place change; on failure a new object each call, so a cache keyed on it
    never answers for a tensor that may have changed."""
    try:
        return tensor._version
    except Exception:
        return object()


# -- writing a .pt2 ----------------------------------------------------------------------------------------------------


def pt2_archive_writer(stream: Any) -> Any:
    """`torch.export.pt2_archive._package.PT2ArchiveWriter(stream)`, torch.export.save's own archive writer; on failure
    the same records through `torch._C.PyTorchFileWriter` (what that writer wraps), so the bytes are the same."""
    try:
        writer = _private("torch.export.pt2_archive._package", "PT2ArchiveWriter", "to write a .pt2 file")
    except MissingDependencyError as error:
        fell_back(_LOG, "the .pt2 archive writer", error)
        return _FileWriterArchive(stream)
    return writer(stream)


class _FileWriterArchive:
    """PT2ArchiveWriter as torch 2.8 to 2.13 write it: torch's zip writer at format version 6, closed with the archive's
    `archive_format` and `archive_version` records when the caller wrote none."""

    FORMAT, VERSION = ("archive_format", "pt2"), ("archive_version", "0")

    def __init__(self, stream: Any):
        import torch

        try:
            self.archive_file = torch._C.PyTorchFileWriter(stream)
            self.archive_file.set_min_version(6)
        except Exception as error:
            raise _unavailable("'torch._C.PyTorchFileWriter'", "to write a .pt2 file", error) from error

    def __enter__(self) -> _FileWriterArchive:
        return self

    def __exit__(self, *exc: Any) -> None:
        written = set(self.archive_file.get_all_written_records())
        for name, value in (self.FORMAT, self.VERSION):
            if name not in written:
                self.write_bytes(name, value.encode())
        self.archive_file.write_end_of_file()

    def write_bytes(self, name: str, data: bytes) -> None:
        self.archive_file.write_record(name, data, len(data))


__all__ = [
    "FAKE_TENSOR_LOGGER",
    "SCALAR_TYPES",
    "batch_norm_base_classes",
    "defer_code",
    "dict_to_program",
    "dropout_base_classes",
    "exported_program_deserializer",
    "fake_tensor",
    "fell_back",
    "free_unbacked_symbols_with_path",
    "graph_module_deserializer",
    "graph_module_own_class",
    "higher_order_operator_class",
    "import_serializer",
    "is_fake_tensor",
    "modes_active",
    "norm_base_classes",
    "op_overload_class",
    "op_name",
    "op_schema",
    "own_tensors",
    "pt2_archive_writer",
    "reader_schema_version",
    "registered_pytree_types",
    "resolve_schema_class",
    "schema_module",
    "serialized_dtypes",
    "stored_code",
    "torch_version",
    "tree_leaves",
    "tree_unflatten",
    "union_base",
    "union_tag",
    "version_counter",
    "with_globals",
]
