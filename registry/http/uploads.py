"""Uploads: the request body goes to a temp file under a size limit, and a bundle is unpacked safely.

Nothing is registered until the whole body has arrived, so a dropped connection or a killed
server leaves the registry as it was (the temp folder is removed in the route's `finally`).
A bundle is a tar of an artifact folder; only regular files and folders with plain relative
names are unpacked (no links, devices, absolute paths or '..'), within the same size limit.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from fastapi import Request
from starlette.requests import ClientDisconnect

from registry.artifact import MANIFEST_FILE
from schemas.errors import InputFileError

from .errors import ApiError

#: After the limit is passed, up to this many more bytes are read and dropped, so the client sees the 413
#: instead of a reset connection while it is still sending.
DRAIN_BYTES = 16 * 1024 * 1024
MAX_MEMBERS = 100_000
SUFFIXES = {"onnx": ".onnx", "keras": ".keras", "pt2": ".pt2", "bundle": ".tar"}


def too_large(limit: int) -> ApiError:
    return ApiError(413, "payload_too_large", f"the upload is larger than this server's limit of {limit} bytes; "
                                              "raise `normbridge serve --max-upload-mb` or upload a smaller file.")


WORKSPACE_PREFIX = "normbridge-upload-"


def new_workspace() -> Path:
    """A private temp folder for one upload, named after this process (the caller removes it)."""
    return Path(tempfile.mkdtemp(prefix=f"{WORKSPACE_PREFIX}{os.getpid()}-"))


def remove_orphaned_workspaces() -> int:
    """Remove upload folders left by server processes that were killed mid-upload (their pid is gone); returns how many."""
    removed = 0
    for folder in Path(tempfile.gettempdir()).glob(f"{WORKSPACE_PREFIX}*-*"):
        pid = folder.name[len(WORKSPACE_PREFIX):].split("-", 1)[0]
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


async def receive_body(request: Request, target: Path, limit: int) -> int:
    """Stream the request body into `target` (never all in memory); 413 beyond `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit + DRAIN_BYTES:
        raise too_large(limit)
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
        raise InputFileError(f"the client disconnected after {received} bytes; nothing was registered, send the whole file again.") from None
    if received > limit:
        raise too_large(limit)
    if received == 0:
        raise InputFileError("the request body is empty; send the model file's bytes as application/octet-stream.")
    return received


def _member_path(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    parts = [p for p in path.parts if p not in ("", ".")]
    if path.is_absolute() or not parts or any(p == ".." for p in parts) or "\\" in name:
        raise InputFileError(f"bundle member '{name}' has an unsafe path; a bundle holds only relative paths inside the artifact folder.")
    return PurePosixPath(*parts)


def extract_bundle(archive: Path, into: Path, limit: int) -> Path:
    """Unpack a bundle tar (plain or compressed) into `into`; returns the artifact folder (the one holding manifest.json)."""
    into.mkdir()
    total = members = 0
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            for member in tar:
                members += 1
                if members > MAX_MEMBERS:
                    raise InputFileError(f"the bundle has more than {MAX_MEMBERS} members; a bundle holds one manifest and its blobs.")
                relative = _member_path(member.name)
                destination = into.joinpath(*relative.parts)
                if member.isdir():
                    destination.mkdir(parents=True, exist_ok=True)
                    continue
                if not member.isreg():
                    raise InputFileError(f"bundle member '{member.name}' is not a regular file (links and devices are refused); "
                                         "pack only the manifest and blob files.")
                total += member.size
                if total > limit:
                    raise too_large(limit)
                destination.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                with source, open(destination, "xb") as out:
                    shutil.copyfileobj(source, out, 1024 * 1024)
    except (tarfile.TarError, EOFError, OSError) as error:
        if isinstance(error, FileExistsError):
            raise InputFileError(f"the bundle holds '{error.filename}' twice; pack each file once.") from error
        raise InputFileError(f"the bundle is not a readable tar archive ({error}); send `tar -cf - -C FOLDER .` of an artifact folder.") from error
    if (into / MANIFEST_FILE).is_file():
        return into
    folders = [p for p in into.iterdir() if p.is_dir() and (p / MANIFEST_FILE).is_file()]
    if len(folders) == 1 and len(list(into.iterdir())) == 1:
        return folders[0]
    raise InputFileError(f"the bundle holds no {MANIFEST_FILE} at its top level; pack an artifact folder (manifest.json and blobs/).")


__all__ = ["SUFFIXES", "extract_bundle", "new_workspace", "receive_body", "remove_orphaned_workspaces", "remove_workspace", "too_large"]
