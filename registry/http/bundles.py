"""A version as a tar stream: manifest.json plus blobs/<digest>.safetensors, written member by member.

The tar is produced on the fly (one blob in memory at a time), with its exact length known in
advance from the stored sizes so the response can carry Content-Length. Every blob is re-hashed
as it is read; a tampered one aborts the stream (the client sees a short body, never bad bytes).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator

from registry.artifact import BLOBS_DIR, MANIFEST_FILE
from schemas.manifest import load_manifest

BLOCK = tarfile.BLOCKSIZE


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _header(name: str, size: int, mtime: float) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.type = size, int(mtime), 0o644, tarfile.REGTYPE
    return info.tobuf(format=tarfile.USTAR_FORMAT)


class VersionBundle:
    """The tar of one version: `length` bytes, produced by iterating `chunks()`."""

    def __init__(self, registry, record):
        self.record = record
        self.manifest = load_manifest(record.manifest)
        self.manifest_bytes = (self.manifest.to_json() + "\n").encode()
        self.digests = self.manifest.blob_digests()
        self._get = registry.blob_reader(record)  # names the version and tensor if a blob was tampered
        self._store = registry.store
        self._mtime = record.created_at.timestamp()
        sizes = [len(self.manifest_bytes)] + [self._store.size(d) for d in self.digests]
        self.length = sum(BLOCK + _padded(s) for s in sizes) + 2 * BLOCK

    def chunks(self) -> Iterator[bytes]:
        yield from self._member(MANIFEST_FILE, self.manifest_bytes)
        for digest in self.digests:
            yield from self._member(f"{BLOBS_DIR}/{digest}.safetensors", self._get(digest))
        yield b"\0" * (2 * BLOCK)

    def _member(self, name: str, data: bytes) -> Iterator[bytes]:
        yield _header(name, len(data), self._mtime)
        yield data
        pad = _padded(len(data)) - len(data)
        if pad:
            yield b"\0" * pad


def read_bundle_names(data: bytes) -> list[str]:
    """Member names of a bundle (tests and clients)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getnames()


__all__ = ["VersionBundle", "read_bundle_names"]
