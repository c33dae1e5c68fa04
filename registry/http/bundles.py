"""A version as a tar stream: manifest.json plus blobs/<digest>.safetensors, written member by member.

For a caller whose scope excludes the parent's model, manifest.json has that parent redacted
(registry.http.redaction) and `digest` is the digest of the manifest sent, so the client's check holds.

The tar is produced on the fly (a few blobs in memory at a time, the next ones read ahead), with
its exact length known in advance from the stored sizes so the response can carry Content-Length.
Every blob is re-hashed as it is read; a tampered one aborts the stream: its last member is then
BUNDLE_ERROR_FILE, the error naming the version and tensor, and the body ends short of its
Content-Length, so every client sees a failed download (never bad bytes) and a normbridge client
can say which tensor was refused.
"""

from __future__ import annotations

import json
import tarfile
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from registry.manifest_io import BLOBS_DIR, BUNDLE_ERROR_FILE, MANIFEST_FILE
from schemas.errors import IntegrityError
from schemas.manifest import load_manifest

BLOCK = tarfile.BLOCKSIZE
#: The error member's JSON is cut to this many bytes, so that member (at most 3 blocks) always ends before the
#: announced length would: what is left to send when a blob fails holds that blob's header and data and 2 end blocks.
ERROR_JSON_BYTES = 2 * BLOCK


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _header(name: str, size: int, mtime: float) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.type = size, int(mtime), 0o644, tarfile.REGTYPE
    return info.tobuf(format=tarfile.USTAR_FORMAT)


class VersionBundle:
    """The tar of one version: `length` bytes, produced by iterating `chunks()`."""

    def __init__(self, registry, record, redactor=None):
        self.record = record
        shown = record.manifest if redactor is None else redactor.manifest(record.manifest)
        self.manifest = load_manifest(shown)
        #: What the client checks the manifest against: the version's digest, unless the redactor changed the manifest.
        self.digest = record.digest if shown is record.manifest else self.manifest.digest()
        self.manifest_bytes = (self.manifest.to_json() + "\n").encode()
        self.digests = self.manifest.blob_digests()
        self._get = registry.blob_reader(record)  # names the version and tensor if a blob was tampered
        self._store = registry.store
        self._mtime = record.created_at.timestamp()
        sizes = [len(self.manifest_bytes)] + [self._store.size(d) for d in self.digests]
        self.length = sum(BLOCK + _padded(s) for s in sizes) + 2 * BLOCK

    def chunks(self) -> Iterator[bytes]:
        yield from self._member(MANIFEST_FILE, self.manifest_bytes)
        try:
            for digest, data in zip(self.digests, self._fetched()):
                yield from self._member(f"{BLOBS_DIR}/{digest}.safetensors", data)
        except IntegrityError as error:  # the response has begun: say why in a last member, then end the body short
            yield from self._member(BUNDLE_ERROR_FILE, _error_json(error))
            raise
        yield b"\0" * (2 * BLOCK)

    def _fetched(self) -> Iterator[bytes]:
        """Each blob's verified bytes in order, up to `parallel_transfers` more being read meanwhile (a network store's
        round trips overlap the sending)."""
        with ThreadPoolExecutor(max_workers=self._store.parallel_transfers) as pool:
            pending: deque = deque()
            for digest in self.digests:
                pending.append(pool.submit(self._get, digest))
                if len(pending) > self._store.parallel_transfers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()

    def _member(self, name: str, data: bytes) -> Iterator[bytes]:
        yield _header(name, len(data), self._mtime)
        yield data
        pad = _padded(len(data)) - len(data)
        if pad:
            yield b"\0" * pad


def _error_json(error: IntegrityError) -> bytes:
    message = str(error)
    while True:
        data = json.dumps({"error": {"code": error.code, "message": message}}).encode()
        if len(data) <= ERROR_JSON_BYTES:
            return data
        message = message[: len(message) // 2]


__all__ = ["VersionBundle"]
