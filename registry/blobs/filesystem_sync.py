"""Making many new files and renames durable with one `syncfs` of their filesystem instead of an fsync each (Linux).

Why: a registration stages a file per tensor (221 for a 53-BatchNorm model) in up to 256 shard folders, and each must be
durable before the version that names it is committed. An fsync per file and per folder cost 120-270 ms of waiting for
the disk on the 2-core machine; one `syncfs` before the renames and one after them cost 12-17 ms. `syncfs` writes every
dirty page and the metadata of the whole filesystem and waits for it (Linux reports a writeback error since 5.8), so
what it covers is a superset of the fsyncs it replaces. It is used only where every folder involved is on the root's
filesystem (a shard folder that is a mount point of another one is fsynced file by file) and for several files at once:
one file's fsync is cheaper than flushing what other programs have written.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from schemas.errors import RegistryError

from .base import FULL_ERRNOS, store_full

#: Fewer paths than this are fsynced one by one.
MIN_PATHS = 8


def linux_libc(name: str, *argtypes):
    """The C library's function `name` with `argtypes` (an int result) on Linux,
    None elsewhere or where it is missing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = argtypes, ctypes.c_int
    return function


_SYNCFS = linux_libc("syncfs", ctypes.c_int)


def sync_filesystem(root: Path, folders: Iterable[Path]) -> bool:
    """Flush the filesystem holding `root` when the new entries of `folders` (several) all live on it; False when it did
    not (not Linux, no folders, a folder on another device): the caller then fsyncs each file and folder itself.

    Raises:
        RegistryError: the filesystem reported an error writing back (the data may not be durable),
            naming the store's folder.
        StorageFullError: that error was a disk with no room left.
    """
    folders = set(folders)
    if _SYNCFS is None or not folders:
        return False
    device = os.stat(root).st_dev
    if any(os.stat(folder).st_dev != device for folder in folders):
        return False
    handle = os.open(root, os.O_RDONLY)
    try:
        if _SYNCFS(handle) != 0:
            error = ctypes.get_errno()
            if error in FULL_ERRNOS:
                raise store_full(root, OSError(error, os.strerror(error)))
            raise RegistryError(
                f"the blob store '{root}' could not be made durable: syncfs of its filesystem failed "
                f"({os.strerror(error)}); nothing was registered: check the disk and register again"
            )
    finally:
        os.close(handle)
    return True


__all__ = ["MIN_PATHS", "linux_libc", "sync_filesystem"]
