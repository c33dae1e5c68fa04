"""The local blob store: read-only files sharded by the first two hex digits ('ab/cdef...').

Sharding as git's object store does, so no folder grows past a few thousand entries; every write
is temp file + fsync + rename (+ fsync of the folder), so a blob appears whole or not at all. A
registration stages its blobs unsynced and syncs them together before publishing (`sync`).
Folders and blobs are private to their owner unless the registry is shared with a group
(registry/file_modes.py). A disk that has no room for a write is a StorageFullError naming the
store, and the temporary file is removed: nothing half written stays.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from schemas.errors import NotFoundError

from .. import file_modes
from ..file_modes import FileModes
from .base import FULL_ERRNOS, HEX_DIGITS, BlobStore, StagedBlob, check_digest, sha256_hex, store_full, stream_mismatch
from .filesystem_sync import MIN_PATHS, linux_libc, sync_filesystem

#: The start of the name of a file `stage_chunks` writes at the store's root until its digest is known.
PENDING_PREFIX = ".pending."


class LocalBlobStore(BlobStore):
    """Blobs as read-only files 'ab/cdef...' under `root`, written by temp file + fsync + rename.

    `modes`: what new folders and blobs get (registry/file_modes.py; default: $NORMBRIDGE_SHARED_GROUP's, private unless
    set).
    """

    stages_unnamed = True

    def __init__(self, root: str | os.PathLike, modes: FileModes | None = None):
        self.root = Path(root).expanduser().resolve()
        self.modes = modes or file_modes.current()
        with self._full_is_an_error():
            file_modes.make_folder(self.root, self.modes)
        self.uri = self.root.as_uri()

    @contextlib.contextmanager
    def _full_is_an_error(self) -> Iterator[None]:
        """An OSError of a disk with no room left (ENOSPC, EDQUOT) becomes the StorageFullError naming this store."""
        try:
            yield
        except OSError as error:
            if error.errno in FULL_ERRNOS:
                raise store_full(self.root, error) from error
            raise

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

    def stage(self, data: bytes, digest: str | None = None, sync: bool = True) -> StagedBlob:
        """Write (and fsync, unless `sync` is False) a hidden temporary file next to the blob's final place
        (not yet a blob)."""
        digest = digest or sha256_hex(data)
        return self._staged(digest, lambda stream: stream.write(data), sync)

    def stage_stream(self, chunks: Iterable[bytes], digest: str, size: int, sync: bool = True) -> StagedBlob:
        """Write the chunks into the hidden temporary file while hashing them, a chunk at a time; a blob already stored
        is not read again. IntegrityError, and the temporary file removed, when they do not hash to `digest`."""

        def write(stream) -> None:
            hashed, length = hashlib.sha256(), 0
            for chunk in chunks:
                hashed.update(chunk)
                length += len(chunk)
                stream.write(chunk)
            if hashed.hexdigest() != digest or length != size:
                raise stream_mismatch(digest, hashed.hexdigest(), length, size)

        return self._staged(digest, write, sync)

    def stage_chunks(self, chunks: Iterable[bytes], sync: bool = True) -> StagedBlob:
        """Write the chunks into a hidden temporary file at the store's root while hashing them, a chunk at a time, then
        move it to where `stage` puts the blob's (or remove it, when the store holds the blob already): one pass over
        the bytes where `stage_stream` needs their digest first."""
        with self._full_is_an_error():
            handle, pending = _new_read_only_file(self.root, PENDING_PREFIX, self.modes)
            try:
                hashed = hashlib.sha256()
                with os.fdopen(handle, "wb") as stream:
                    for chunk in chunks:
                        hashed.update(chunk)
                        stream.write(chunk)
                    stream.flush()
                    if sync:
                        os.fsync(stream.fileno())
                    else:
                        _start_writeback(stream.fileno())
                digest = hashed.hexdigest()
                target = self.path_of(digest)
                if target.exists():
                    os.unlink(pending)
                    return StagedBlob(digest=digest)
                file_modes.make_folder(target.parent, self.modes)
                temporary = target.parent / f".{digest[2:10]}.{secrets.token_hex(6)}.tmp"
                os.rename(pending, temporary)  # the same filesystem; its name now says what it is being written as
            except BaseException:
                Path(pending).unlink(missing_ok=True)
                raise
        return StagedBlob(digest=digest, temporary=temporary, synced=sync)

    def _staged(self, digest: str, write: Callable, sync: bool) -> StagedBlob:
        target = self.path_of(digest)
        if target.exists():
            return StagedBlob(digest=digest)
        with self._full_is_an_error():
            file_modes.make_folder(target.parent, self.modes)
            handle, temporary = _new_read_only_file(target.parent, f".{digest[2:10]}.", self.modes)
            try:
                with os.fdopen(handle, "wb") as stream:
                    write(stream)
                    stream.flush()
                    if sync:
                        os.fsync(stream.fileno())
                    else:
                        _start_writeback(stream.fileno())
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        return StagedBlob(digest=digest, temporary=Path(temporary), synced=sync)

    def sync(self, staged: list[StagedBlob]) -> None:
        """Make every staged file not synced yet durable: several at once with one syncfs of the store's filesystem
        (filesystem_sync), else an fsync each. Why in one call: written without a sync each and with their writeback
        started as they were written, 221 small blobs took 12-17 ms with syncfs and 50-270 ms synced one by one."""
        pending = [blob for blob in staged if blob.temporary is not None and not blob.synced]
        if len(pending) >= MIN_PATHS and sync_filesystem(self.root, {blob.temporary.parent for blob in pending}):
            for blob in pending:
                blob.synced = True
            return
        for blob in pending:
            handle = os.open(blob.temporary, os.O_RDONLY)
            try:
                with self._full_is_an_error():  # a filesystem that allocates at writeback reports the full disk here
                    os.fsync(handle)
            finally:
                os.close(handle)
            blob.synced = True

    def publish(self, staged: StagedBlob) -> str:
        self.publish_all([staged])
        return staged.digest

    def publish_all(self, staged: list[StagedBlob], progress: Callable[[int], None] | None = None) -> None:
        """Sync what is not, rename every blob into place, then fsync each folder once (or sync the filesystem once for
        many folders: filesystem_sync): the renames are durable when this returns (one journal commit for all, where a
        sync of each folder after its rename cost one each)."""
        staged = list(staged)
        self.sync(staged)
        folders: dict[Path, None] = {}
        for i, blob in enumerate(staged):
            if progress is not None:
                progress(i)
            if blob.temporary is None:
                if blob.data is not None:
                    self.put(blob.data)
                continue
            target = self.path_of(blob.digest)
            try:
                with self._full_is_an_error():
                    os.replace(blob.temporary, target)
            except BaseException:
                for left in staged[i:]:
                    self.discard(left)
                raise
            folders[target.parent] = None
        if len(folders) >= MIN_PATHS and sync_filesystem(self.root, folders):
            return
        for folder in folders:
            _fsync_folder(folder)

    def discard(self, staged: StagedBlob) -> None:
        if staged.temporary is not None:
            staged.temporary.unlink(missing_ok=True)

    def remove_stale_staging(self, older_than_seconds: float, keep: Callable[[str], bool] | None = None) -> int:
        now = time.time()

        def removed_if_stale(entry: Path) -> int:
            try:
                if now - entry.stat().st_mtime >= older_than_seconds:
                    entry.unlink()
                    return 1
            except FileNotFoundError:
                pass
            return 0

        # stage_chunks' files, before their digest was known
        removed = sum(removed_if_stale(entry) for entry in self.root.glob(f"{PENDING_PREFIX}*.tmp"))
        for shard in self.root.iterdir():
            if not shard.is_dir():
                continue
            for entry in shard.glob(".*.tmp"):
                if keep is not None and keep(shard.name + entry.name[1:9]):  # '.{digest[2:10]}.*.tmp' (see stage)
                    continue
                removed += removed_if_stale(entry)
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
            raise NotFoundError(
                f"blob {digest} is not in the blob store {self.uri}; it was never stored or was removed by gc"
            ) from None

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


def _new_read_only_file(folder: Path, prefix: str, modes: FileModes) -> tuple[int, str]:
    """A new hidden '<prefix><random>.tmp' in `folder`, open for writing, created with the blob mode (read-only: 0400,
    or 0440 for a registry shared with its group, registry/file_modes.py).

    Created with that mode rather than chmod-ed after tempfile.mkstemp, so the bytes are never readable by anyone the
    blob will not be. The mode applies to later opens only, so this descriptor still writes.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        path = os.path.join(folder, f"{prefix}{secrets.token_hex(6)}.tmp")
        try:
            handle = os.open(path, flags, modes.blob)
        except FileExistsError:
            continue
        try:
            if modes.shared:  # the group's read bit, whatever the umask
                os.fchmod(handle, modes.blob)
        except OSError:
            os.close(handle)
            os.unlink(path)
            raise
        return handle, path
    raise FileExistsError(
        f"could not create a temporary blob file in '{folder}' after 100 attempts; run normbridge gc to remove stale .*.tmp files."
    )


def _start_writeback(handle: int) -> None:
    """Ask the kernel to start writing the file's dirty pages now, without waiting (Linux sync_file_range; elsewhere a
    no-op): the later fsync of many files then finds most of them written."""
    if _SYNC_FILE_RANGE is None:
        return
    _SYNC_FILE_RANGE(handle, ctypes.c_longlong(0), ctypes.c_longlong(0), _SYNC_FILE_RANGE_WRITE)


_SYNC_FILE_RANGE = linux_libc("sync_file_range", ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint)
_SYNC_FILE_RANGE_WRITE = 2


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
