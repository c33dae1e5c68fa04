"""Uploads of model files: the request body goes to a temp file under a size limit.

Nothing is registered until the whole body has arrived, so a dropped connection or a killed
server leaves the registry as it was (the temp folder is removed in the route's `finally`).
Bundles take another path: they are read while they arrive (body_pipe, registry.bundle_stream).
A `.pt2` or `.keras` is a zip whose entries may be deflated, so what its entries unpack to counts
against the same limit, as a bundle's decompressed tar does (`refuse_unpacked_excess`), and so do the
bytes a `.keras` file's weights declare (HDF5 datasets may be compressed or never written) and the bytes a `.pt2` file's
tensors claim (a stride-0 view claims more than its payload stores).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

from fastapi import Request
from starlette.requests import ClientDisconnect

from converters.adapters import REGISTRY
from converters.file_claims import claimed_tensor_bytes
from registry.blobs.base import FULL_ERRNOS
from registry.bundle_stream import too_large
from schemas.errors import InputFileError, PayloadTooLargeError, StorageFullError

#: After the limit is passed, up to this many more bytes are read and dropped, so the client sees the 413
#: instead of a reset connection while it is still sending.
DRAIN_BYTES = 16 * 1024 * 1024
#: Upload format -> the suffix the upload is saved under (each framework's structure format: FrameworkInfo); bundles are
#: read as they arrive, not saved.
SUFFIXES = REGISTRY.structure_suffixes()
#: Upload formats that are zip archives.
ZIP_FORMATS = frozenset(info.structure_format for info in REGISTRY.infos() if info.archive is not None)


WORKSPACE_PREFIX = "normbridge-upload-"


def without_workspace_paths(message: str) -> str:
    """`message` with the server's upload folders taken out: the uploaded file is 'the uploaded .pt2 file', a file
    inside the upload is named from the upload's root. The client never saw those paths,
    and the server's layout is its own."""
    root = re.escape(tempfile.gettempdir().rstrip("/")) + "/" + re.escape(WORKSPACE_PREFIX) + r"[^/\s']+"
    message = re.sub(rf"'?{root}/upload(\.[A-Za-z0-9]+)'?", r"the uploaded \1 file", message)
    return re.sub(rf"{root}/?", "", message)


def new_workspace() -> Path:
    """A private temp folder for one upload, named after this process (the caller removes it)."""
    return Path(tempfile.mkdtemp(prefix=f"{WORKSPACE_PREFIX}{os.getpid()}-"))


def remove_orphaned_workspaces() -> int:
    """Remove upload folders left by server processes that were killed mid-upload (their pid is gone);
    returns how many."""
    removed = 0
    for folder in Path(tempfile.gettempdir()).glob(f"{WORKSPACE_PREFIX}*-*"):
        pid = folder.name[len(WORKSPACE_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        except PermissionError:  # alive, another user's
            continue
    return removed


def remove_workspace(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


async def refuse_declared_excess(request: Request, limit: int) -> None:
    """413 when Content-Length already says the body is larger than `limit`, before any of it is read as a model or a
    bundle (a body of zeros is not 'an unreadable tar', it is too large). Up to DRAIN_BYTES past the limit are read and
    dropped first, so the client sees the answer; beyond that, nothing is read."""
    declared = request.headers.get("content-length")
    if declared is None or not declared.isdigit() or int(declared) <= limit:
        return
    if int(declared) <= limit + DRAIN_BYTES:
        received = 0
        try:
            async for chunk in request.stream():
                received += len(chunk)
                if received > limit + DRAIN_BYTES:
                    break
        except ClientDisconnect:
            pass
    raise too_large(limit)


async def receive_body(request: Request, target: Path, limit: int) -> int:
    """Stream the request body into `target` (never all in memory); 413 beyond `limit` bytes."""
    await refuse_declared_excess(request, limit)
    received = 0
    try:
        with open(target, "xb") as out:
            async for chunk in request.stream():
                received += len(chunk)
                if received > limit + DRAIN_BYTES:
                    break
                if received <= limit:
                    out.write(chunk)
    except ClientDisconnect:  # nobody is left to answer; nothing was registered
        raise InputFileError(
            f"the client disconnected after {received} bytes; nothing was registered, send the whole file again."
        ) from None
    except OSError as error:
        if error.errno not in FULL_ERRNOS:
            raise
        # the server's own folder is not the client's business: named by its setting only
        raise StorageFullError(
            f"the server's folder for uploads has no room left after {received} bytes ({error.strerror}); nothing was "
            "registered: its operator must free space there or point TMPDIR at a disk with room, then send the file "
            "again.",
            setting="TMPDIR",
        ) from None
    if received > limit:
        raise too_large(limit)
    if received == 0:
        raise InputFileError("the request body is empty; send the model file's bytes as application/octet-stream.")
    return received


def refuse_unpacked_excess(path: Path, limit: int) -> None:
    """413 when the zip archive at `path` declares entries that unpack to more than `limit` bytes, before any is read.

    A megabyte of deflated zeros unpacks to a gigabyte, which the readers hold in memory (the .pt2 reader reads an
    entry whole; Keras reads config.json whole and refuses only ratios over 100x). Both read through `zipfile`, which
    never inflates an entry past the size its central directory declares, so the declared sizes bound the bytes.
    A file that is not a zip passes: its reader refuses it, naming the problem.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return
    if unpacked > limit:
        raise PayloadTooLargeError(
            f"the uploaded archive's entries unpack to {unpacked} bytes, more than this server's limit of {limit} "
            "bytes; raise `normbridge serve --max-upload-mb` or upload a smaller model."
        )
    claimed = claimed_tensor_bytes(path)
    if claimed is not None and claimed.nbytes > limit:
        raise PayloadTooLargeError(
            f"the uploaded {path.suffix} file's {claimed}, more than this server's limit of "
            f"{limit} bytes; raise `normbridge serve --max-upload-mb` or upload a smaller model."
        )


__all__ = [
    "DRAIN_BYTES",
    "SUFFIXES",
    "ZIP_FORMATS",
    "new_workspace",
    "receive_body",
    "refuse_declared_excess",
    "refuse_unpacked_excess",
    "remove_orphaned_workspaces",
    "remove_workspace",
]
