"""A `.pt2`'s program JSON as torch's schema dataclasses, what depends only on a class worked out once per class.

Why: torch's `_dict_to_dataclass` (torch/_export/serde/serialize.py) calls `typing.get_type_hints` for every object it
builds (about 8,000 calls for a 53-BatchNorm ResNet, half a second of a cold `normbridge register`), and each union it
builds through `_Union.create` lists the class's fields twice and checks their names again. This is the same conversion,
branch for branch, as one converter function per schema type, made once: a union is filled in as `create` fills it
(every field None but the tag's, then `_type`, one `_UnionTag` per class and tag), and a JSON scalar bound for a type
that keeps it as it is (a str, an enum) is taken without a call. tests/converters/test_program_schema.py holds its
result equal to torch's on exported programs.

Every torch name it reaches is in torch_internals; should any of it fail (a torch whose schema module changed), the
document is converted by torch's own `_dict_to_dataclass` instead, with one debug line.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import types
import typing
from typing import Annotated, Any, Callable

from .. import torch_internals

Converter = Callable[[Any], Any]

_DONE: dict[Any, Converter] = {}  # published converters, complete (read without the lock)
_LOCK = threading.Lock()
_RESERVED = ("type", "_type", "create", "value")  # the names _Union.__post_init__ refuses
_SCALARS = frozenset({str, int, bool, type(None)})  # JSON values a converter in _KEEPS_SCALARS returns as they are
_KEEPS_SCALARS: set[Converter] = set()  # converters of a type that is not a float and has no arguments (str, an enum)
union_fields = _fields = (
    object.__getattribute__
)  # a union's own attributes, past _Union.__getattribute__ (which only adds a check for unset members)


_LOG = logging.getLogger(__name__)


def program_from_dict(document: Any) -> Any:
    """`torch._export.serde.serialize._dict_to_dataclass(schema.ExportedProgram, document)`, faster, or torch's own when
    the faster conversion fails (for a malformed document torch's then raises its own error)."""
    try:
        return quick_program_from_dict(document)
    except Exception as error:
        torch_internals.fell_back(_LOG, "the program's schema conversion", error)
    return torch_internals.dict_to_program(document)


def quick_program_from_dict(document: Any) -> Any:
    """The faster conversion alone (raising where it cannot convert)."""
    return converter(torch_internals.schema_module().ExportedProgram)(document)


def converter(cls: Any) -> Converter:
    """The function `_dict_to_dataclass(cls, ...)` amounts to."""
    found = _DONE.get(cls)
    if found is None:
        with _LOCK:
            building: dict[Any, Converter] = {}
            found = _build(cls, building)
            _DONE.update(building)
    return found


def _build(cls: Any, building: dict[Any, Converter]) -> Converter:
    """`cls`'s converter; a schema type met again while it is being made (a Graph inside a node's argument) gets a
    forwarder to it."""
    found = _DONE.get(cls) or building.get(cls)
    if found is None:
        made: list[Converter] = []
        building[cls] = lambda data: made[0](data)
        made.append(_make(cls, building))
        found = building[cls] = made[0]
    return found


def _make(cls: Any, building: dict[Any, Converter]) -> Converter:
    schema = torch_internals.schema_module()
    cls = torch_internals.resolve_schema_class(cls)
    if isinstance(cls, str):
        raise AssertionError(f"Unresolved class type: '{cls}'.")
    if typing.get_origin(cls) is Annotated:
        return _build(cls.__origin__, building)
    if typing.get_origin(cls) in (typing.Union, types.UnionType) and type(None) in typing.get_args(cls):
        arguments = typing.get_args(cls)
        if len(arguments) != 2:
            raise AssertionError(f"expected 2 type args, got {len(arguments)}")
        inner = _build(arguments[0], building)
        return lambda data: None if data is None else inner(data)
    if isinstance(cls, type) and issubclass(cls, torch_internals.union_base()):
        return _union(cls, typing.get_type_hints(cls, globalns=vars(schema)), building)
    if dataclasses.is_dataclass(cls):
        return _dataclass(cls, typing.get_type_hints(cls, globalns=vars(schema)), building)
    return _value(cls, building)


def _union(cls: Any, hints: dict, building: dict[Any, Converter]) -> Converter:
    """`cls.create(**{tag: converted value})` for a one-key dict, as `_dict_to_dataclass` checks and builds it."""
    names = tuple(field.name for field in dataclasses.fields(cls))
    members: dict[
        str, tuple[Converter, Any, bool]
    ] = {}  # tag: (its value's converter, its _UnionTag, whether it keeps scalars)
    if _plain_union(cls):  # else every member takes torch's create, as it is
        if any(name in _RESERVED for name in names):
            raise AssertionError("field names 'type', '_type', 'create', 'value' are reserved")
        members = {name: (_build(hints[name], building), torch_internals.union_tag(name, cls)) for name in names}
        members = {name: (convert, tag, convert in _KEEPS_SCALARS) for name, (convert, tag) in members.items()}
    nones = dict.fromkeys(names)
    new = object.__new__

    def convert(data: Any) -> Any:
        if not isinstance(data, dict):
            raise AssertionError(f"expected dict, got {type(data).__name__}")
        if len(data) != 1:
            raise AssertionError(f"expected dict with 1 key, got {len(data)}")
        ((tag, value),) = data.items()
        if not isinstance(tag, str):
            raise AssertionError(f"expected str key, got {type(tag).__name__}")
        member = members.get(tag)
        if member is None:  # not a field: torch's own path, for its error (or a union it builds differently)
            return cls.create(**{tag: converter(hints[tag])(value)})
        convert_member, union_tag, keeps_scalars = member
        obj = new(cls)
        state = _fields(obj, "__dict__")
        state.update(nones)
        state[tag] = value if keeps_scalars and type(value) in _SCALARS else convert_member(value)
        state["_type"] = union_tag
        return obj

    return convert


def _plain_union(cls: Any) -> bool:
    """Whether `cls.create` does only what `convert` does: _Union's own create and checks, a dataclass __init__ that
    sets the fields, no attribute hooks."""
    _Union = torch_internals.union_base()
    return (
        cls.create.__func__ is _Union.create.__func__
        and cls.__post_init__ is _Union.__post_init__
        and cls.__setattr__ is object.__setattr__
        and cls.__new__ is object.__new__
        and cls.__dataclass_params__.init
        and not getattr(cls, "__slots__", ())
    )


def _dataclass(cls: Any, hints: dict, building: dict[Any, Converter]) -> Converter:
    """`cls(**fields)`, keys the class does not define ignored, as torch does (forward compatibility)."""
    fields = tuple((field.name, _build(hints[field.name], building)) for field in dataclasses.fields(cls))
    fields = tuple((name, convert_field, convert_field in _KEEPS_SCALARS) for name, convert_field in fields)

    def convert(data: Any) -> Any:
        found = {}
        for name, convert_field, keeps_scalars in fields:
            if name in data:
                value = data[name]
                found[name] = value if keeps_scalars and type(value) in _SCALARS else convert_field(value)
        return cls(**found)

    return convert


def _value(cls: Any, building: dict[Any, Converter]) -> Converter:
    """A list or dict converted item by item by the type's arguments (looked up only for a list or dict, as torch
    does), a float made a float, anything else as it is."""
    arguments = typing.get_args(cls)
    item = _build(arguments[0], building) if arguments else None
    entry = _build(arguments[1], building) if len(arguments) > 1 else None
    is_float = cls is float
    item_keeps_scalars = item in _KEEPS_SCALARS

    def convert(data: Any) -> Any:
        if isinstance(data, list):
            if not data:
                return data
            if item is None:
                raise IndexError("tuple index out of range")
            if item_keeps_scalars:
                return [value if type(value) in _SCALARS else item(value) for value in data]
            return [item(value) for value in data]
        if isinstance(data, dict):
            if entry is None:
                raise IndexError("tuple index out of range")
            return {key: entry(value) for key, value in data.items()}
        return float(data) if is_float else data

    if not arguments and not is_float:
        _KEEPS_SCALARS.add(convert)
    return convert


__all__ = ["converter", "program_from_dict", "quick_program_from_dict", "union_fields"]
