"""Atomic writes: a temporary sibling, fsync, rename. A failed write leaves nothing behind.

What is written here is the user's (an export, a spec folder, a recalibrated model), so it gets
the permissions any file they write gets: the temporary sibling is created with the mode open()
and mkdir() ask for (0666 / 0777), from which the kernel takes the umask (0644 / 0755 under 022)
and applies any default ACL. tempfile.mkstemp and mkdtemp create 0600 / 0700 instead, which a
model server running as another user cannot read. Replacing an existing file or folder keeps its
permission bits, so a model the user made private stays private.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Callable

from .errors import OutputPathError

#: Modes asked of the kernel for a new file and folder; the process umask is taken off them.
FILE_MODE = 0o666
FOLDER_MODE = 0o777
_ATTEMPTS = 100
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def _sibling(target: Path, suffix: str) -> Path:
    return target.parent / f".{target.name}.{secrets.token_hex(6)}{suffix}"


def _existing_mode(target: Path) -> int | None:
    """Permission bits of `target` when it already exists (and is not a symlink), else None."""
    try:
        status = target.lstat()
    except FileNotFoundError:
        return None
    return None if stat.S_ISLNK(status.st_mode) else stat.S_IMODE(status.st_mode)


def _new_file(target: Path) -> tuple[int, Path]:
    """A new, exclusively created sibling of `target`, open for writing (never an existing file or symlink)."""
    for _ in range(_ATTEMPTS):
        candidate = _sibling(target, ".tmp")
        try:
            return os.open(candidate, _OPEN_FLAGS, FILE_MODE), candidate
        except FileExistsError:
            continue
    raise FileExistsError(
        f"could not create a temporary file beside '{target}' after {_ATTEMPTS} attempts; remove stale .{target.name}.*.tmp files."
    )


def _new_folder(target: Path) -> Path:
    for _ in range(_ATTEMPTS):
        candidate = _sibling(target, "")
        try:
            candidate.mkdir(FOLDER_MODE)
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(
        f"could not create a temporary folder beside '{target}' after {_ATTEMPTS} attempts; remove stale .{target.name}.* folders."
    )


def writable(target: str | os.PathLike, folder: bool = False) -> Path:
    """`target` as a Path, once nothing visible stops a file (or, with `folder`, a folder) being written there; else an
    OutputPathError naming the path and what is in the way. Commands call it before their work, so an export does not
    fail at its last step; the writers below call it too, and turn what the system refuses later into the same error."""
    target = Path(target)
    if folder and target.exists() and not target.is_dir():
        raise OutputPathError(f"'{target}' is a file, and a folder is written there; remove it or pass another path.")
    if not folder and target.is_dir():
        raise OutputPathError(
            f"'{target}' is a folder, and a file is written there; pass a file path inside it or beside it."
        )
    ancestor = target.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputPathError(f"cannot write '{target}': '{ancestor}' is a file, not a folder.")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write '{target}': no permission to write in '{ancestor}'.")
    return target


@contextlib.contextmanager
def _refused_as_output(target: Path) -> Iterator[None]:
    """What the system refuses while making or publishing `target` (a read-only or full disk, /proc) as an
    OutputPathError."""
    try:
        yield
    except OSError as error:
        raise OutputPathError(f"cannot write '{target}': {error.strerror or error}.") from error


def make_folder(target: str | os.PathLike) -> Path:
    """Create the output folder `target` (and its parents), or raise OutputPathError naming it and what is in the
    way."""
    target = writable(target, folder=True)
    with _refused_as_output(target):
        target.mkdir(parents=True, exist_ok=True)
    return target


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `target` so that readers see the old file or the whole new one, never a part."""
    with atomic_writer(target) as stream:
        stream.write(data)
    return Path(target)


@contextlib.contextmanager
def atomic_writer(target: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary stream into a temporary sibling of `target` that becomes `target` (fsync, rename) when the block ends
    without an error, and is removed when it raises: a large file is written once, straight to disk, never held whole in
    memory, and readers still see the old file or the whole new one."""
    target = writable(target)
    with _refused_as_output(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        keep = _existing_mode(target)
        handle, temporary = _new_file(target)
    try:
        with os.fdopen(handle, "wb") as stream:
            if keep is not None:
                os.chmod(stream.fileno(), keep)
            yield stream
            with _refused_as_output(target):
                stream.flush()
                os.fsync(stream.fileno())
        with _refused_as_output(target):
            os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def atomic_write_folder(target: str | os.PathLike, fill: Callable[[Path], object]) -> Path:
    """Let `fill` populate a temporary sibling folder, then move it to `target` (replacing it)."""
    target = writable(target, folder=True)
    with _refused_as_output(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        keep = _existing_mode(target)
        temporary = _new_folder(target)
    try:
        if keep is not None:
            os.chmod(temporary, keep)
        fill(temporary)
        with _refused_as_output(target):
            if target.exists():
                shutil.rmtree(target)
            os.replace(temporary, target)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return target
