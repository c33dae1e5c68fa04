"""Tensor blobs written a chunk at a time: the safetensors header, then the tensor's bytes streamed from where they are.

A registration hashes each blob once while extracting the artifact, then stages it from the same place again
(registry/service/registration.py), so no tensor's blob is ever held whole in memory unless it is small or asked for
as bytes. A blob's bytes are exactly `tensor_blobs.tensor_blob` of its array (the same digest, whichever way it was
written): `blob_header` writes the header safetensors writes, and tests compare the two.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

import numpy as np

from schemas.safetensors_io import SAFETENSORS_DTYPES

#: Bytes handed on at a time.
CHUNK_BYTES = 8 * 1024 * 1024
_CODES = {name: code for code, name in SAFETENSORS_DTYPES.items()}


def blob_header(dtype: str, shape: list[int], nbytes: int) -> bytes:
    """The 8-byte length and JSON header safetensors writes for one tensor named "tensor"
    (padded with spaces to 8 bytes)."""
    text = json.dumps(
        {"tensor": {"dtype": _CODES[dtype], "shape": list(shape), "data_offsets": [0, nbytes]}}, separators=(",", ":")
    )
    text += " " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text.encode()


class TensorBlob:
    """One tensor's blob, read again on demand: from `source` (an object with `chunks(size)`: converters.tensor_bytes),
    else from the array's own memory. `digest` and `size` are known once `hash()` has read it.

    `snapshot`: the array belongs to a caller's live model, which may change after extraction, so `hash()` keeps the
    blob's bytes as they were then (a model read from a file for the registration alone is streamed instead)."""

    def __init__(self, array: np.ndarray, source: Any = None, snapshot: bool = False):
        self.array, self.source = array, source
        self.header = blob_header(array.dtype.name, list(array.shape), int(array.nbytes))
        self.size = len(self.header) + int(array.nbytes)
        self.digest: str | None = None
        self.snapshot = snapshot and source is None
        self.data: bytes | None = None

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The blob's bytes: the header, then the tensor's C-order little-endian bytes, at most `size` at a time."""
        if self.data is not None:
            for start in range(0, len(self.data), size):
                yield self.data[start : start + size]
            return
        yield self.header
        if self.source is not None:
            yield from self.source.chunks(size)
            return
        array = np.ascontiguousarray(self.array)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        flat = array.reshape(-1).view(np.uint8)
        for start in range(0, flat.size, size):
            yield flat[start : start + size].tobytes()

    def hash(self) -> str:
        """The blob's sha256, read through `chunks` (once; the value is kept)."""
        if self.digest is None and self.snapshot:
            self.data = b"".join(self.chunks())
            self.digest = hashlib.sha256(self.data).hexdigest()
        elif self.digest is None:
            self.digest = hash_chunks(self.chunks())[0]
        return self.digest


def hash_chunks(chunks: Iterable[bytes]) -> tuple[str, int]:
    """(sha256 hex, length) of the concatenated chunks."""
    digest, length = hashlib.sha256(), 0
    for chunk in chunks:
        digest.update(chunk)
        length += len(chunk)
    return digest.hexdigest(), length


class BlobMap(MutableMapping):
    """digest -> blob bytes, where a tensor's blob is read only when asked for (`bytes` by `[]`, chunks by `chunks`)."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes | TensorBlob] = {}

    def add(self, blob: TensorBlob) -> str:
        """Hash `blob` and keep it under its digest (equal blobs are kept once); returns the digest."""
        digest = blob.hash()
        self._blobs.setdefault(digest, blob)
        return digest

    def chunks(self, digest: str) -> Iterator[bytes]:
        """The bytes of `digest` a chunk at a time."""
        blob = self._blobs[digest]
        if isinstance(blob, TensorBlob):
            yield from blob.chunks()
        else:
            for start in range(0, len(blob), CHUNK_BYTES):
                yield blob[start : start + CHUNK_BYTES]

    def size(self, digest: str) -> int:
        blob = self._blobs[digest]
        return blob.size if isinstance(blob, TensorBlob) else len(blob)

    def __getitem__(self, digest: str) -> bytes:
        blob = self._blobs[digest]
        if not isinstance(blob, TensorBlob):
            return blob
        return blob.data if blob.data is not None else b"".join(blob.chunks())

    def __setitem__(self, digest: str, data: bytes) -> None:
        self._blobs[digest] = data

    def __delitem__(self, digest: str) -> None:
        del self._blobs[digest]

    def __iter__(self) -> Iterator[str]:
        return iter(self._blobs)

    def __len__(self) -> int:
        return len(self._blobs)

    def __repr__(self) -> str:
        return f"BlobMap({len(self)} blobs)"


__all__ = ["BlobMap", "CHUNK_BYTES", "TensorBlob", "blob_header", "hash_chunks"]
