"""An ONNX graph's structure: the model with its initializers' raw_data left out, filled back from the tensors by name.

The skeleton is the same ModelProto with every initializer's `raw_data` emptied; putting each tensor's little-endian
bytes back gives `SerializeToString()` of the registered model, so a file written by onnx.save (no external data)
comes back byte-identical. Checked when the structure is cut: if filling the skeleton back does not give the same
bytes (an initializer kept in a typed field such as float_data is left in the skeleton as it is), the whole model is
the part instead, still content-addressed.
"""

from __future__ import annotations


import numpy as np
import onnx
from google.protobuf.message import DecodeError

from schemas import InputFileError

from ..model_structure import StructureParts, little_endian_bytes, sha256_of

PART = "model.onnx"


def _has_data(tensor: onnx.TensorProto) -> bool:
    typed = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
    return (
        bool(tensor.raw_data)
        or any(len(getattr(tensor, name)) for name in typed)
        or tensor.data_location == onnx.TensorProto.EXTERNAL
    )


def onnx_structure(model: onnx.ModelProto, tensors: dict[str, np.ndarray], read_safely: bool = False) -> StructureParts:
    """The skeleton of `model` (initializers without raw_data); `tensors` are the initializers by name, as stored;
    `read_safely`: `model` is what the safe reader read from the registered file.

    Cut from the model's serialized bytes (no second copy of the model's weights): each initializer whose raw_data is
    its tensor's bytes (checked one at a time) has that field left out (`_without_raw_data`)."""
    whole = model.SerializeToString()
    cleared = _refillable(model, tensors)
    if cleared is None:
        # the bytes would not come back the same: keep the graph whole
        return StructureParts("onnx", {PART: whole}, sha256_of(whole), read_safely=read_safely)
    return StructureParts(
        "onnx", {PART: _without_raw_data(whole, {i.name for i in cleared})}, sha256_of(whole), read_safely=read_safely
    )


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def _encoded(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fields(data: memoryview):
    """(field number, the field's whole record, its payload when length-delimited) of a serialized message."""
    at = 0
    while at < len(data):
        start = at
        key, at = _varint(data, at)
        kind, payload = key & 7, None
        if kind == 0:
            at = _varint(data, at)[1]
        elif kind == 1:
            at += 8
        elif kind == 5:
            at += 4
        elif kind == 2:
            length, at = _varint(data, at)
            payload, at = data[at : at + length], at + length
        else:
            raise ValueError(f"wire type {kind} in a serialized ONNX model")
        yield key >> 3, data[start:at], payload


def _rewritten(data: memoryview, edit) -> bytes:
    """The message with each field's record replaced by `edit(number, record, payload)` (bytes, or None to keep it)."""
    out = []
    for number, record, payload in _fields(data):
        replaced = edit(number, record, payload)
        out.append(bytes(record) if replaced is None else replaced)
    return b"".join(out)


def _without_raw_data(whole: bytes, names: set[str]) -> bytes:
    """`whole` (ModelProto bytes as protobuf writes them) with the raw_data (field 9) of the initializers named `names`
    (ModelProto.graph = 7, GraphProto.initializer = 5, TensorProto.name = 8) left out, every other byte as it was: what
    serializing the model with those fields cleared gives."""

    def tensor(number, record, payload):
        if number != 5:
            return None
        name = next((bytes(p).decode("utf-8", "replace") for n, _, p in _fields(payload) if n == 8), None)
        if name not in names:
            return None
        body = _rewritten(payload, lambda n, r, p: b"" if n == 9 else None)
        return _encoded(5 << 3 | 2) + _encoded(len(body)) + body

    def graph(number, record, payload):
        if number != 7:
            return None
        body = _rewritten(payload, tensor)
        return _encoded(7 << 3 | 2) + _encoded(len(body)) + body

    return _rewritten(memoryview(whole), graph)


def _refillable(model: onnx.ModelProto, tensors: dict[str, np.ndarray]) -> list | None:
    """The initializers the skeleton leaves empty, or None when filling it back (`_fill`) would not give `model`'s
    bytes: a raw_data that is not its tensor's little-endian bytes, or an initializer without data that `_fill` would
    give some."""
    cleared = []
    for initializer in model.graph.initializer:
        if initializer.raw_data and initializer.name in tensors:
            if little_endian_bytes(tensors[initializer.name]) != initializer.raw_data:
                return None
            cleared.append(initializer)
        elif not _has_data(initializer):
            return None
    return cleared


def onnx_file(parts: dict[str, bytes], tensors: dict[str, np.ndarray]) -> bytes:
    """The registered .onnx file's bytes: the skeleton with every initializer's data put back."""
    if set(parts) != {PART}:
        raise InputFileError(
            f"an ONNX structure holds exactly the part '{PART}', got {sorted(parts)}; the stored version is inconsistent."
        )
    return _fill(parts[PART], tensors, "the stored structure")


def _fill(part: bytes, tensors: dict[str, np.ndarray], where: str) -> bytes:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(part)
    except (DecodeError, ValueError) as error:
        raise InputFileError(
            f"{where} '{PART}' is not an ONNX protobuf ({error}); the stored version is corrupted."
        ) from error
    for initializer in model.graph.initializer:
        if not _has_data(initializer):
            array = tensors.get(initializer.name)
            if array is None:
                raise InputFileError(
                    f"initializer '{initializer.name}' of {where} has no tensor in the version; the stored version is inconsistent."
                )
            initializer.raw_data = little_endian_bytes(array)
    return model.SerializeToString()


__all__ = ["PART", "onnx_file", "onnx_structure"]
