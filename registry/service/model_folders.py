"""Giving a version back as a folder of files (a Hugging Face checkpoint folder): whole and atomic,
every blob re-hashed.

The folder is written by the framework's model adapter (`ModelAdapter.write_model_folder`) into a hidden temporary
sibling of the target, its tensors streamed from the store in the order the files hold them (blob_fetch.py, each blob
re-hashed as it arrives: a tampered one stops the pull), every file fsynced, then renamed into place in one step: the
folder appears whole or not at all, and a failed pull leaves nothing behind. An existing target is never overwritten.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from converters.adapters import REGISTRY
from schemas.atomic_io import atomic_write_folder, writable
from schemas.errors import OutputPathError
from schemas.manifest import ArtifactManifest

from ..structure import structure_parts
from .blob_fetch import FetchedTensors

#: Structure format -> the framework that writes it back as a folder (FrameworkInfo.folder_formats).
FOLDER_FORMATS: dict[str, str] = REGISTRY.folder_formats()
#: progress(step, done, total), as registration reports it.
Progress = Callable[[str, int, int], None]


def folder_target(path: str | Path, ref: str) -> Path:
    """Where a folder version is written: `path` itself when it does not exist yet (or is an empty folder), else
    '<name>-<N>' inside the existing folder `path`; OutputPathError when that exists too (nothing is overwritten) or
    cannot be written."""
    target = Path(path)
    if target.is_dir() and any(target.iterdir()):
        target = target / ref.replace("@", "-")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise OutputPathError(
            f"'{target}' already exists; {ref} is written as a new folder: remove it or pass another path."
        )
    return writable(target, folder=True)


def write_version_folder(
    manifest: ArtifactManifest,
    get: Callable[[str], bytes],
    parallel: int,
    target: Path,
    progress: Progress | None = None,
) -> int:
    """Write `manifest`'s folder to `target` atomically (schemas.atomic_io.atomic_write_folder: a temporary sibling
    renamed into place, replacing at most the empty folder `folder_target` allowed), every file and folder fsynced
    first; the bytes written."""
    adapter = REGISTRY.model_adapter(manifest.framework)
    written = 0

    def fill(staging: Path) -> None:
        nonlocal written
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            digests = sorted({ref.digest for ref in manifest.structure.parts.values()})
            parts = structure_parts(manifest, dict(zip(digests, pool.map(get, digests))).__getitem__)
            tensors = FetchedTensors(manifest, get, pool, adapter.folder_tensor_order(parts), progress)
            try:
                written = adapter.write_model_folder(parts, tensors, staging)
                _fsync_tree(staging)
            except OSError as error:  # a full or read-only disk: the folder is not written, and says so
                raise OutputPathError(f"cannot write '{target}': {error.strerror or error}.") from error
            finally:
                pool.shutdown(wait=True, cancel_futures=True)  # after a refusal, blobs not yet read are not read

    atomic_write_folder(target, fill)
    _fsync(target.parent)
    if progress:
        progress("writing", written, written)
    return written


def load_version_folder(manifest: ArtifactManifest, get: Callable[[str], bytes], parallel: int):
    """The framework's object for a folder version: the folder written to a temporary place, loaded, and removed."""
    with tempfile.TemporaryDirectory(prefix="normbridge-load-") as scratch:
        target = Path(scratch) / "model"
        write_version_folder(manifest, get, parallel, target)
        return REGISTRY.model_adapter(manifest.framework).load_model_folder(target)


def _fsync_tree(root: Path) -> None:
    """Every folder under `root` (files were fsynced as they were written), so the names survive a crash too."""
    for folder, _, _ in os.walk(root):
        _fsync(Path(folder))


def _fsync(folder: Path) -> None:
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


__all__ = ["FOLDER_FORMATS", "folder_target", "load_version_folder", "write_version_folder"]
