"""A model's structure as the registry stores it beside the tensors: files of the model's format without the tensor bytes.

`ModelAdapter.structure_of` cuts a model into `parts` (file name -> bytes: an ONNX graph whose initializers hold no
data, a .keras config and metadata, a .pt2 program's JSON entries), checked at once to give the same model back
when `ModelAdapter.model_file` puts the tensors back in. Nothing here is a pickle or code; every part is read
back through the framework's safe reader (onnx protobuf, Keras safe_mode, the project's .pt2 reader).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

#: The file suffix `pull` writes per structure format.
STRUCTURE_SUFFIXES: dict[str, str] = {"onnx": ".onnx", "keras": ".keras", "pt2": ".pt2"}


@dataclass(frozen=True)
class StructureParts:
    """The parts of one model's structure; `file_digest`: sha256 of the file they rebuild when it is byte-identical to the
    registered one (ONNX), else None (a rebuilt .keras or .pt2 archive holds the same model in a new file)."""

    format: str
    parts: dict[str, bytes] = field(default_factory=dict)
    file_digest: str | None = None


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def little_endian_bytes(array: np.ndarray) -> bytes:
    """The tensor's bytes as ONNX raw_data and .pt2 payloads hold them (little-endian, C order)."""
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.tobytes()


__all__ = ["STRUCTURE_SUFFIXES", "StructureParts", "little_endian_bytes", "sha256_of"]
