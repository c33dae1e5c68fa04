"""The blob store contract: bytes in, sha256 out, never served unless they still hash right.

`BlobStore` is what every store implements (registry/blobs/local.py, registry/blobs/s3.py); the
URI-scheme table that picks one is registry/blobs/__init__.py, so the base and the stores never
import each other (as MLflow keeps artifact_repository_registry apart from the repositories).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
import errno
import hashlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from schemas.errors import IntegrityError, RegistryError, StorageFullError

HEX_DIGITS = frozenset("0123456789abcdef")
#: Bytes read (and hashed) at a time when a blob is streamed in.
READ_CHUNK = 8 * 1024 * 1024
#: The errno values of a write refused for want of room: no space left on the device, a disk quota used up.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def store_full(store: object, error: OSError) -> StorageFullError:
    """The one-line error of a blob store whose disk refused a write for want of room (`error`: ENOSPC or EDQUOT)."""
    return StorageFullError(
        f"the blob store '{store}' has no room left ({error.strerror or error}); nothing was stored: free space on "
        "its disk, or point NORMBRIDGE_BLOBS (--blobs; default NORMBRIDGE_HOME/blobs) at a disk with room, and try again.",
        setting="NORMBRIDGE_BLOBS",
    )


def sha256_hex(data: bytes) -> str:
    """The digest every blob is addressed by."""
    return hashlib.sha256(data).hexdigest()


def check_digest(digest: str) -> str:
    """Refuse anything that is not a lowercase sha256 hex string (it becomes a file path)."""
    if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= HEX_DIGITS:
        raise RegistryError(
            f"blob digest {digest!r} is not a sha256 hex string; expected 64 lowercase hex digits as returned by put()"
        )
    return digest


class BlobStore(abc.ABC):
    """Immutable, content-addressed bytes. `uri` names the store (what `open_blob_store` accepts)."""

    uri: str
    #: How many blobs a registration stages, or a bundle download or a pull reads ahead, at once (a network store
    #: overlaps round trips; a disk does not gain).
    parallel_transfers: int = 1
    #: Whether a registration stages its blobs in a thread beside the equivalence gate. A network store gains (its
    #: threads wait on round trips); a local disk does not: each write hands the GIL back and forth with the gate's
    #: Python, which stalled the gate more than the writes took alone (53 BatchNorms: 660 ms of gate beside the staging,
    #: 320 ms + 115 ms one after the other).
    stages_beside_gate: bool = False
    #: Whether `stage_chunks` writes a blob as it hashes it, never holding it whole (a local folder: a file renamed once
    #: its digest is known); a registration then stages a checkpoint's tensors while it is still reading the model
    #: (registry/early_staging.py). S3 names an object before writing it.
    stages_unnamed: bool = False

    @abc.abstractmethod
    def put(self, data: bytes) -> str:
        """Store `data` atomically (idempotent) and return its sha256 hex digest."""

    @abc.abstractmethod
    def get(self, digest: str) -> bytes:
        """The bytes of `digest`, re-hashed: IntegrityError if they changed, NotFoundError if absent."""

    @abc.abstractmethod
    def exists(self, digest: str) -> bool:
        """Whether a blob is stored under `digest` (not re-hashed)."""

    @abc.abstractmethod
    def delete(self, digest: str) -> None:
        """Remove a blob (garbage collection only); absent blobs are not an error."""

    @abc.abstractmethod
    def digests(self) -> Iterator[str]:
        """Every stored digest, in no particular order."""

    @abc.abstractmethod
    def size(self, digest: str) -> int:
        """Stored size in bytes (NotFoundError if absent)."""

    @abc.abstractmethod
    def age_seconds(self, digest: str) -> float:
        """Seconds since the blob was written (gc keeps young unreferenced blobs: a registration may be in flight)."""

    def head_of(self, digest: str, size: int) -> tuple[bytes, int]:
        """(the first `size` bytes of the blob, its whole length), not re-hashed: enough to read a file header."""
        data = self.get(digest)
        return data[:size], len(data)

    def read_verified(self, digest: str, read: Callable[[int], bytes]) -> bytes:
        """Every byte `read(n)` gives until it gives none, hashed chunk by chunk as it arrives (no second pass over the
        blob, and over a network the hashing overlaps the wait for the next chunk);
        IntegrityError unless it is `digest`."""
        sha = hashlib.sha256()
        chunks = []
        while chunk := read(READ_CHUNK):
            sha.update(chunk)
            chunks.append(chunk)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return self._refuse_changed(digest, sha.hexdigest()) or data

    def verified(self, digest: str, data: bytes) -> bytes:
        """`data` if it still hashes to `digest`; IntegrityError otherwise (tampered bytes are never served)."""
        return self._refuse_changed(digest, sha256_hex(data)) or data

    def _refuse_changed(self, digest: str, actual: str) -> None:
        if actual != digest:
            raise IntegrityError(
                f"blob {digest} in {self.uri} now hashes to {actual}: its bytes were modified or corrupted, "
                "so it is not served; restore it from a backup or re-register the version"
            )

    # Staging lets a registration write its bytes while the equivalence gate runs and publish them
    # only if it passes. The default stages in memory; the local store writes hidden synced files;
    # S3 writes the object at once (see registry/blobs/s3.py). Either way no version references a blob
    # before the commit, so a refused registration's blobs are unreachable, and gc removes them.

    def stage(self, data: bytes, digest: str | None = None, sync: bool = True) -> "StagedBlob":
        """Prepare `data` for publishing; returns the staged blob. `digest`, when given, is sha256(data) as the caller
        computed it (a registration hashes every blob once, on arrival). `sync=False`: a store that writes files leaves
        them unsynced for one `sync` of many blobs (publishing syncs whatever is not)."""
        return StagedBlob(digest=digest or sha256_hex(data), data=data)

    def stage_stream(self, chunks: Iterable[bytes], digest: str, size: int, sync: bool = True) -> "StagedBlob":
        """Stage the blob whose `size` bytes arrive as `chunks` and must hash to `digest`; IntegrityError (and nothing
        staged) if they do not. A store that can write as it reads (local files, S3 multipart) never holds the blob
        whole; this default joins the chunks."""
        data = b"".join(chunks)
        actual = sha256_hex(data)
        if actual != digest or len(data) != size:
            raise stream_mismatch(digest, actual, len(data), size)
        return self.stage(data, digest, sync)

    def stage_chunks(self, chunks: Iterable[bytes], sync: bool = True) -> "StagedBlob":
        """Stage the blob whose bytes arrive as `chunks`, its digest computed on the way (`stage_stream` needs it
        first). This default joins the chunks; a store with `stages_unnamed` writes them as they come."""
        return self.stage(b"".join(chunks), sync=sync)

    def publish(self, staged: "StagedBlob") -> str:
        """Make a staged blob visible (atomic, idempotent); returns its digest."""
        return staged.digest if staged.data is None else self.put(staged.data)

    def sync(self, staged: list["StagedBlob"]) -> None:
        """Make staged blobs durable before they are published (a store writing files syncs them; others have nothing to
        do)."""

    def publish_all(self, staged: list["StagedBlob"], progress: Callable[[int], None] | None = None) -> None:
        """`publish` each staged blob, in order; `progress(i)` as the i-th starts."""
        for i, blob in enumerate(staged):
            if progress is not None:
                progress(i)
            self.publish(blob)

    def discard(self, staged: "StagedBlob") -> None:
        """Forget a staged blob that will not be published."""

    def remove_stale_staging(self, older_than_seconds: float, keep: Callable[[str], bool] | None = None) -> int:
        """Remove staged leftovers of crashed writers older than the given age; returns how many.

        `keep(start)` is asked about each leftover with the start of the digest it is being written as (as much as
        its name tells, the whole digest on S3) and keeps it when True: gc keeps what leased digests are being
        written as (registry/blob_leases.py), whatever their age.
        """
        return 0


def stream_mismatch(digest: str, actual: str, length: int, size: int) -> IntegrityError:
    """The error of a streamed blob whose bytes are not the ones it was hashed as (its source changed since)."""
    return IntegrityError(
        f"blob '{digest}' ({size} bytes) read again as {length} bytes hashing to '{actual}': its source changed "
        "while it was being registered; nothing was stored under either digest, register again."
    )


@dataclass
class StagedBlob:
    """Bytes on their way into a store: in memory, or a written temporary file (synced unless `synced` is False)."""

    digest: str
    data: bytes | None = None
    temporary: Path | None = None
    synced: bool = True
