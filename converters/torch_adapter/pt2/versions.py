"""Whether this torch reads a `.pt2` program as the torch that wrote it meant it: read when so,
else refused naming both.

torch.export.save records the program's `schema_version` ({major, minor}) and the `torch_version` that wrote it in
models/model.json. torch's deserializer refuses another major version, but reads any minor version of its own major one
by dropping every key its schema does not define (`_dict_to_dataclass`: "for forward compatibility"), so a field or a
union member a newer torch added would be lost without a word and the program read as something else. Hence:

- another major version is refused, before torch sees the program;
- a newer minor version is read only when this torch's schema defines every key and union member it holds (a newer torch
  that used nothing new wrote what this one would have), else refused, naming the first key this torch does not know;
- an older minor version is read as torch reads it: a minor version only adds fields, each with a default.

tests/converters/test_pt2_versions.py crafts each case from a genuine file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import types
import typing
from typing import Any

from schemas import InputFileError

from .. import torch_internals

_LOG = logging.getLogger(__name__)
_TORCH_VERSION = re.compile(r"[\w.+<=-]{1,40}")


def check_schema_version(document: dict, where: str) -> None:
    """Refuse a program (parsed JSON, already checked by program_checks.py) this torch would read as something else.

    Raises:
        InputFileError: naming `where`, the schema and torch versions of the file and of this torch.
    """
    try:
        reader = torch_internals.reader_schema_version()
    except Exception as error:  # torch's deserializer still refuses another major version itself
        torch_internals.fell_back(_LOG, "the schema version check", error)
        return
    written = _written(document.get("schema_version"))
    if written is None:
        raise InputFileError(
            f"{where}: 'schema_version' is {json.dumps(document.get('schema_version'))[:80]}, expected "
            '{"major": N, "minor": N} as torch.export.save writes it; the file was altered: save the model with '
            "torch.export.save."
        )
    if written[0] != reader[0]:
        _refuse(document, where, written, reader, f"this torch reads schema version {reader[0]}.x only")
    if written[1] > reader[1]:
        unknown = unknown_key(document)
        if unknown is not None:
            _refuse(
                document,
                where,
                written,
                reader,
                f"its '{unknown}' is not in schema {reader[0]}.{reader[1]}, which this torch "
                "reads (torch would drop it without a word)",
            )


def unknown_key(document: dict) -> str | None:
    """The path of the first key or union member of `document` that this torch's schema does not define, or None."""
    schema = torch_internals.schema_module()
    return _unknown(schema.ExportedProgram, document, "", vars(schema))


def _written(version: Any) -> tuple[int, int] | None:
    if not isinstance(version, dict):
        return None
    major, minor = version.get("major"), version.get("minor")
    return (major, minor) if type(major) is int and type(minor) is int else None


def _refuse(document: dict, where: str, written: tuple[int, int], reader: tuple[int, int], why: str) -> None:
    writer = document.get("torch_version")
    writer = f"torch {writer}" if isinstance(writer, str) and _TORCH_VERSION.fullmatch(writer) else "an unnamed torch"
    mine = torch_internals.torch_version()
    raise InputFileError(
        f"{where} holds a torch.export program of schema version {written[0]}.{written[1]} (written by {writer}), and {why}; this "
        f"is torch {mine} (schema {reader[0]}.{reader[1]}): save the model again with torch.export.save under torch {mine}, or "
        f"run normbridge with the torch that wrote it."
    )


def _unknown(cls: Any, data: Any, path: str, namespace: dict) -> str | None:
    """As torch's `_dict_to_dataclass` walks `data` for `cls`, the first key it would drop or union tag it would not
    know."""
    cls = torch_internals.resolve_schema_class(cls)
    while True:
        if typing.get_origin(cls) is typing.Annotated:
            cls = cls.__origin__
        elif typing.get_origin(cls) in (typing.Union, types.UnionType):
            if data is None:
                return None
            cls = torch_internals.resolve_schema_class(next(a for a in typing.get_args(cls) if a is not type(None)))
        else:
            break
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        if not isinstance(data, dict):
            return None  # torch's conversion refuses it
        hints = typing.get_type_hints(cls, globalns=namespace)
        fields = {field.name for field in dataclasses.fields(cls)}
        is_union = issubclass(cls, torch_internals.union_base())
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in fields:
                return where
            if is_union and len(data) != 1:
                return None  # torch's conversion refuses it
            found = _unknown(hints[key], value, where, namespace)
            if found is not None:
                return found
        return None
    arguments = typing.get_args(cls)
    if isinstance(data, list) and arguments:
        for index, item in enumerate(data):
            found = _unknown(arguments[0], item, f"{path}[{index}]", namespace)
            if found is not None:
                return found
    elif isinstance(data, dict) and len(arguments) > 1:
        for key, value in data.items():
            found = _unknown(arguments[1], value, f"{path}[{key!r}]", namespace)
            if found is not None:
                return found
    return None


__all__ = ["check_schema_version", "unknown_key"]
