"""A `.pt2`'s program JSON as torch's schema dataclasses, each class's type hints resolved once.

Why: torch's `_dict_to_dataclass` (torch/_export/serde/serialize.py) calls `typing.get_type_hints` for every object it
builds: about 8,000 calls for a 53-BatchNorm ResNet, half a second of a cold `normbridge register`. This is the same
conversion, branch for branch, with what depends only on the class worked out once per class.
tests/converters/test_program_schema.py holds its result equal to torch's on exported programs.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Annotated, Any


def program_from_dict(document: Any) -> Any:
    """`torch._export.serde.serialize._dict_to_dataclass(schema.ExportedProgram, document)`, faster."""
    from torch._export.serde import schema

    return _convert(schema.ExportedProgram, document)


@functools.cache
def _plan(cls: Any) -> tuple[str, Any]:
    """What `_dict_to_dataclass` does with `cls` before it looks at the data: (branch, what the branch needs)."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import _resolve_schema_cls
    from torch._export.serde.union import _Union

    cls = _resolve_schema_cls(cls)
    if isinstance(cls, str):
        raise AssertionError(f"Unresolved class type: '{cls}'.")
    if typing.get_origin(cls) is Annotated:
        return "same", cls.__origin__
    if typing.get_origin(cls) in (typing.Union, types.UnionType) and type(None) in typing.get_args(cls):
        arguments = typing.get_args(cls)
        if len(arguments) != 2:
            raise AssertionError(f"expected 2 type args, got {len(arguments)}")
        return "optional", arguments[0]
    if isinstance(cls, type) and issubclass(cls, _Union):
        return "union", (cls, typing.get_type_hints(cls, globalns=vars(schema)))
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls, globalns=vars(schema))
        return "dataclass", (cls, tuple((field.name, hints[field.name]) for field in dataclasses.fields(cls)))
    return "value", cls


def _convert(cls: Any, data: Any) -> Any:
    branch, how = _plan(cls)
    if branch == "same":
        return _convert(how, data)
    if branch == "optional":
        return None if data is None else _convert(how, data)
    if branch == "union":
        if not isinstance(data, dict):
            raise AssertionError(f"expected dict, got {type(data).__name__}")
        if len(data) != 1:
            raise AssertionError(f"expected dict with 1 key, got {len(data)}")
        (tag, value), = data.items()
        if not isinstance(tag, str):
            raise AssertionError(f"expected str key, got {type(tag).__name__}")
        union, hints = how
        return union.create(**{tag: _convert(hints[tag], value)})
    if branch == "dataclass":  # keys the class does not define are ignored, as torch does (forward compatibility)
        dataclass, fields = how
        return dataclass(**{name: _convert(hint, data[name]) for name, hint in fields if name in data})
    if isinstance(data, list):
        return data if not data else [_convert(typing.get_args(how)[0], item) for item in data]
    if isinstance(data, dict):
        value_type = typing.get_args(how)[1]
        return {key: _convert(value_type, value) for key, value in data.items()}
    if how is float:
        return float(data)
    return data


__all__ = ["program_from_dict"]
