"""Content-addressed blob storage: bytes in, sha256 out, never served unless they still hash right.

The interface is small on purpose so that an S3-compatible store can implement it later; the
local one shards by the first two hex digits ('ab/cdef...'), as git's object store does, so no
folder grows past a few thousand entries.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

from schemas.errors import IntegrityError, NotFoundError, RegistryError

HEX_DIGITS = frozenset("0123456789abcdef")


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
    #: How many blobs a registration stages, or a bundle download reads ahead, at once (a network store overlaps round
    #: trips; a disk does not gain).
    parallel_transfers: int = 1

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

    def verified(self, digest: str, data: bytes) -> bytes:
        """`data` if it still hashes to `digest`; IntegrityError otherwise (tampered bytes are never served)."""
        actual = sha256_hex(data)
        if actual != digest:
            raise IntegrityError(
                f"blob {digest} in {self.uri} now hashes to {actual}: its bytes were modified or corrupted, "
                "so it is not served; restore it from a backup or re-register the version"
            )
        return data

    # Staging lets a registration write its bytes while the equivalence gate runs and publish them
    # only if it passes. The default stages in memory; the local store writes hidden synced files;
    # S3 writes the object at once (see blobstore_s3). Either way no version references a blob
    # before the commit, so a refused registration's blobs are unreachable, and gc removes them.

    def stage(self, data: bytes, digest: str | None = None) -> "StagedBlob":
        """Prepare `data` for publishing; returns the staged blob. `digest`, when given, is sha256(data) as the caller
        computed it (a registration hashes every blob once, on arrival)."""
        return StagedBlob(digest=digest or sha256_hex(data), data=data)

    def publish(self, staged: "StagedBlob") -> str:
        """Make a staged blob visible (atomic, idempotent); returns its digest."""
        return staged.digest if staged.data is None else self.put(staged.data)

    def discard(self, staged: "StagedBlob") -> None:
        """Forget a staged blob that will not be published."""

    def remove_stale_staging(self, older_than_seconds: float, keep: Callable[[str], bool] | None = None) -> int:
        """Remove staged leftovers of crashed writers older than the given age; returns how many.

        `keep(start)` is asked about each leftover with the start of the digest it is being written as (as much as
        its name tells, the whole digest on S3) and keeps it when True: gc keeps what leased digests are being
        written as (registry/blob_leases.py), whatever their age.
        """
        return 0


@dataclass
class StagedBlob:
    """Bytes on their way into a store: in memory, or a written and synced temporary file."""

    digest: str
    data: bytes | None = None
    temporary: Path | None = None


class LocalBlobStore(BlobStore):
    """Blobs as read-only files 'ab/cdef...' under `root`, written by temp file + fsync + rename."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = self.root.as_uri()

    def __repr__(self) -> str:
        return f"LocalBlobStore({str(self.root)!r})"

    def path_of(self, digest: str) -> Path:
        """Where `digest` lives (whether or not it exists)."""
        check_digest(digest)
        return self.root / digest[:2] / digest[2:]

    def put(self, data: bytes) -> str:
        # Stage then publish: temp file, fsync, read-only, rename, fsync the folder. Another writer
        # may have renamed the same bytes in between: replacing it is harmless.
        return self.publish(self.stage(data))

    def stage(self, data: bytes, digest: str | None = None) -> StagedBlob:
        """Write and fsync a hidden temporary file next to the blob's final place (not yet a blob)."""
        digest = digest or sha256_hex(data)
        target = self.path_of(digest)
        if target.exists():
            return StagedBlob(digest=digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{digest[2:10]}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(data)
                stream.flush()
                os.fsync(stream.fileno())
            os.chmod(temporary, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return StagedBlob(digest=digest, temporary=Path(temporary))

    def publish(self, staged: StagedBlob) -> str:
        if staged.temporary is None:
            return super().publish(staged)
        target = self.path_of(staged.digest)
        try:
            os.replace(staged.temporary, target)
        except BaseException:
            staged.temporary.unlink(missing_ok=True)
            raise
        _fsync_folder(target.parent)
        return staged.digest

    def discard(self, staged: StagedBlob) -> None:
        if staged.temporary is not None:
            staged.temporary.unlink(missing_ok=True)

    def remove_stale_staging(self, older_than_seconds: float, keep: Callable[[str], bool] | None = None) -> int:
        removed = 0
        now = time.time()
        for shard in self.root.iterdir():
            if not shard.is_dir():
                continue
            for entry in shard.glob(".*.tmp"):
                if keep is not None and keep(shard.name + entry.name[1:9]):  # '.{digest[2:10]}.*.tmp' (see stage)
                    continue
                try:
                    if now - entry.stat().st_mtime >= older_than_seconds:
                        entry.unlink()
                        removed += 1
                except FileNotFoundError:
                    continue
        return removed

    def get(self, digest: str) -> bytes:
        path = self.path_of(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise NotFoundError(
                f"blob {digest} is not in the blob store {self.uri}; it was never stored or was removed by gc"
            ) from None
        return self.verified(digest, data)

    def head_of(self, digest: str, size: int) -> tuple[bytes, int]:
        try:
            with open(self.path_of(digest), "rb") as handle:
                return handle.read(size), os.fstat(handle.fileno()).st_size
        except FileNotFoundError:
            raise NotFoundError(f"blob {digest} is not in the blob store {self.uri}; it was never stored or was removed by gc") from None

    def exists(self, digest: str) -> bool:
        return self.path_of(digest).is_file()

    def delete(self, digest: str) -> None:
        self.path_of(digest).unlink(missing_ok=True)

    def digests(self) -> Iterator[str]:
        for shard in sorted(self.root.iterdir()):
            if len(shard.name) != 2 or not shard.is_dir() or not set(shard.name) <= HEX_DIGITS:
                continue
            for entry in shard.iterdir():
                name = shard.name + entry.name
                if len(name) == 64 and set(name) <= HEX_DIGITS:
                    yield name

    def _stat(self, digest: str) -> os.stat_result:
        try:
            return self.path_of(digest).stat()
        except FileNotFoundError:
            raise NotFoundError(f"blob {digest} is not in the blob store {self.uri}; check the digest") from None

    def size(self, digest: str) -> int:
        return self._stat(digest).st_size

    def age_seconds(self, digest: str) -> float:
        return max(0.0, time.time() - self._stat(digest).st_mtime)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def _open_file(uri: str) -> BlobStore:
    parsed = urlparse(uri)
    if parsed.netloc not in ("", "localhost"):
        raise RegistryError(
            f"blob store URI {uri!r} names host {parsed.netloc!r}; a file URI must be local, e.g. 'file:///abs/path'"
        )
    return LocalBlobStore(unquote(parsed.path))


def _open_s3(uri: str) -> BlobStore:
    # Imported only when an s3:// store is opened, so boto3 is not loaded otherwise.
    from .blobstore_s3 import open_s3

    return open_s3(uri)


#: URI scheme -> factory ('s3' is registry.blobstore_s3, imported lazily).
SCHEMES: dict[str, Callable[[str], BlobStore]] = {"file": _open_file, "s3": _open_s3}


def open_blob_store(uri: str | os.PathLike) -> BlobStore:
    """Open a blob store from 'file:///abs/path', a plain path or 's3://bucket/prefix'."""
    text = os.fspath(uri)
    scheme = urlparse(text).scheme
    # A plain path has no scheme (or a one-letter Windows drive).
    if not scheme or (len(scheme) == 1 and os.name == "nt"):
        return LocalBlobStore(text)
    factory = SCHEMES.get(scheme.lower())
    if factory is None:
        raise RegistryError(
            f"blob store URI {text!r} has the unknown scheme {scheme!r}; "
            f"currently registered schemes are {', '.join(sorted(SCHEMES))}"
        )
    return factory(text)
