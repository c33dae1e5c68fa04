"""The tensors a `.pt2`'s payload configs describe: their metadata checked, what they claim counted, views made safely.

torch.export.save records each weight and constant as a payload (raw bytes) and a tensor_meta (dtype, sizes, strides,
offset, device) that says how to view it. The meta comes from the file, so every field is checked before torch sees it:
plain int64 sizes, strides and offset (torch refuses larger ones with errors of its own), a dtype torch serializes, a
device this process can hold (a payload is made on its device: 'cuda' on a CPU build, 'meta', 'hpu' or another backend
fails inside torch). What a tensor claims (elements x itemsize) is what it costs once anything reads it whole, which a
stride-0 view or torch's rule for an empty payload (zeros of the claimed size) would make far more than the archive
stores, so `ClaimedBytes` counts every claim against the same limits as stored bytes before anything is made.
"""

from __future__ import annotations

import json
import math
from typing import Any

from schemas import InputFileError

from ..torch_internals import serialized_dtypes

#: Sizes, strides and offsets are int64 in torch.
MAX_DIMENSION = 2**63 - 1
MAX_RANK = 64
_STRIDED_LAYOUT = 7  # torch._export.serde.schema.Layout.Strided


def tensor_meta(meta: Any, where: str) -> dict:
    """dtype, sizes, strides, offset, device and requires_grad of a payload, all plain values (never expressions).

    Raises:
        InputFileError: naming `where` and the field that is not what torch.export.save writes.
    """
    if not isinstance(meta, dict):
        raise InputFileError(f"{where} has no tensor_meta; save the model with torch.export.save.")
    dtype = serialized_dtypes().get(meta.get("dtype")) if type(meta.get("dtype")) is int else None
    if dtype is None:
        _refuse(where, "dtype", meta.get("dtype"), "a dtype torch.export serializes")
    sizes, strides = _ints(meta.get("sizes"), where, "sizes"), _ints(meta.get("strides"), where, "strides")
    if len(sizes) != len(strides):
        _refuse(where, "strides", meta.get("strides"), f"one stride per size ({len(sizes)})")
    offset = _ints([meta.get("storage_offset")], where, "storage_offset")[0]
    if meta.get("layout") != _STRIDED_LAYOUT:
        _refuse(where, "layout", meta.get("layout"), f"{_STRIDED_LAYOUT} (strided)")
    if type(meta.get("requires_grad")) is not bool:
        _refuse(where, "requires_grad", meta.get("requires_grad"), "true or false")
    if meta["requires_grad"] and not (dtype.is_floating_point or dtype.is_complex):
        _refuse(
            where, "requires_grad", True, f"false for a {dtype} tensor (only floating point tensors have gradients)"
        )
    return {
        "dtype": dtype,
        "sizes": sizes,
        "strides": strides,
        "offset": offset,
        "requires_grad": meta["requires_grad"],
        "device": _device(meta.get("device"), where),
    }


def _ints(values: Any, where: str, field: str) -> tuple[int, ...]:
    if not isinstance(values, list) or len(values) > MAX_RANK:
        _refuse(where, field, values, f"a list of at most {MAX_RANK} plain integers")
    found = [v.get("as_int") if isinstance(v, dict) and set(v) == {"as_int"} else None for v in values]
    if not all(type(v) is int and 0 <= v <= MAX_DIMENSION for v in found):
        _refuse(where, field, values, "plain integers from 0 to 2**63 - 1 (int64), never expressions")
    return tuple(found)


def _device(device: Any, where: str) -> tuple[str, int | None]:
    """(type, index) of a device this process can make a tensor on: the CPU, or CUDA when this torch has it."""
    import torch

    kind, index = (device.get("type"), device.get("index")) if isinstance(device, dict) else (None, None)
    if index is not None and (type(index) is not int or index < 0):
        _refuse(where, "device", device, "a device index that is null or a non-negative integer")
    if kind == "cpu" and index in (None, 0):
        return kind, index
    if kind == "cuda" and torch.cuda.is_available() and (index or 0) < torch.cuda.device_count():
        return kind, index
    raise InputFileError(
        f"{where}: 'device' is {json.dumps(device)[:100]}, a device this torch cannot make the tensor on "
        f"(normbridge reads tensors on the CPU{', or CUDA' if torch.cuda.is_available() else ''}); move the model "
        "to the CPU (model.cpu()) before torch.export.export and save it again."
    )


def numel(meta: dict) -> int:
    return math.prod(meta["sizes"])


def claimed_bytes(meta: dict) -> int:
    """What the tensor costs once read whole: its elements times its dtype's size, whatever its payload stores."""
    return numel(meta) * meta["dtype"].itemsize


class ClaimedBytes:
    """A running total of what an archive's tensors claim, refused past `limit` bytes (`described` ends the sentence
    naming it: "the N bytes {described}") before any is made."""

    def __init__(self, limit: int, described: str):
        self.limit, self.described, self.total = limit, described, 0

    def add(self, claimed: int, where: str) -> None:
        self.total += claimed
        if self.total > self.limit:
            raise InputFileError(
                f"{where} claims {claimed} bytes of tensor data, bringing the archive's tensors to {self.total} bytes, "
                f"more than the {self.limit} bytes {self.described}; a payload must store what its tensor claims: save the "
                "model with torch.export.save."
            )


def view(flat: Any, meta: dict, where: str) -> Any:
    """`flat` (a payload's elements) viewed with the meta's sizes, strides and offset;
    a view reaching past it is refused."""
    import torch

    sizes, strides, offset = meta["sizes"], meta["strides"], meta["offset"]
    extent = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides)) + 1
    if all(sizes) and extent > flat.numel():
        raise InputFileError(
            f"{where} reaches element {extent - 1} of a payload of {flat.numel()} elements; the archive is corrupt."
        )
    return torch.as_strided(flat, sizes, strides, offset)


def parameter(tensor: Any, meta: dict) -> Any:
    import torch

    return torch.nn.Parameter(tensor, requires_grad=meta["requires_grad"])


def _refuse(where: str, field: str, value: Any, expected: str) -> None:
    raise InputFileError(
        f"{where}: tensor_meta '{field}' is {json.dumps(value)[:120]}, expected {expected}; the archive was altered: "
        "save the model with torch.export.save."
    )


__all__ = ["ClaimedBytes", "MAX_DIMENSION", "claimed_bytes", "numel", "parameter", "tensor_meta", "view"]
