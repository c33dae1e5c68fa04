"""A model's structure as the registry stores it beside the tensors: files of the model's format without the tensor
bytes.

`ModelAdapter.structure_of` cuts a model into `parts` (file name -> bytes: an ONNX graph whose initializers hold no
data, a .keras config and metadata, a .pt2 program's JSON entries), checked at once to give the same model back
when `ModelAdapter.model_file` puts the tensors back in. Nothing here is a pickle or code; every part is read
back through the framework's safe reader (onnx protobuf, Keras safe_mode, the project's .pt2 reader).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class StructureParts:
    """The parts of one model's structure; `file_digest`: sha256 of the file they rebuild when it is byte-identical to
    the registered one (ONNX), else None (a rebuilt .keras or .pt2 archive holds the same model in a new file).

    `read_safely`: the parts are what the framework's safe reader accepted when it loaded the registered file (a .pt2's
    own entries, the graph or config of the model read from the file), so the registry need not rebuild and read them
    back to know a reader accepts them; False for a model given as an object, whose parts no reader has seen."""

    format: str
    parts: dict[str, bytes] = field(default_factory=dict)
    file_digest: str | None = None
    read_safely: bool = False


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def little_endian_bytes(array: np.ndarray) -> bytes:
    """The tensor's bytes as ONNX raw_data and .pt2 payloads hold them (little-endian, C order)."""
    return little_endian_view(array).tobytes()


def little_endian_view(array: np.ndarray) -> memoryview:
    """The same bytes as `little_endian_bytes`, without a copy when the array already holds them (C order,
    little-endian): a pulled file is written from its blobs' bytes as they are."""
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return memoryview(array.reshape(-1).view(np.uint8))


__all__ = ["StructureParts", "little_endian_bytes", "little_endian_view", "sha256_of"]
