"""The modes of what the registry creates on disk: private to its owner, or shared with a team's group when configured.

Why: the database and the blobs hold every registered model, so by default no other local user may read them: folders
are created 0700, the database 0600 and blobs (read-only once written) 0400, whatever the umask allows. A team that
shares one NORMBRIDGE_HOME (a folder of its group with the setgid bit, mode 2775 or 2770) sets
NORMBRIDGE_SHARED_GROUP=1: folders are then created 2770 (the setgid bit keeps the group on everything created inside),
the database 0660 and blobs 0440, so the group reads and writes the registry and other users read nothing. SQLite
creates its -wal, -shm and -journal files with the database file's own mode, so creating the database with its mode
covers them. Files and folders that already exist are left as they are (docs/registry.md says how to tighten an older
registry).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from schemas.errors import RegistryError

SHARED_GROUP_ENV = "NORMBRIDGE_SHARED_GROUP"


@dataclass(frozen=True)
class FileModes:
    """The modes new folders, files (the database) and blobs get; `shared`: set exactly, past the umask (group bits)."""

    folder: int
    file: int
    blob: int
    shared: bool = False


PRIVATE = FileModes(folder=0o700, file=0o600, blob=0o400)
SHARED_GROUP = FileModes(folder=0o2770, file=0o660, blob=0o440, shared=True)


def current() -> FileModes:
    """SHARED_GROUP when $NORMBRIDGE_SHARED_GROUP is 1, PRIVATE when it is unset, empty or 0.

    Raises:
        RegistryError: any other value, naming the setting.
    """
    raw = os.environ.get(SHARED_GROUP_ENV, "").strip().lower()
    if raw in ("", "0", "no", "false"):
        return PRIVATE
    if raw in ("1", "yes", "true"):
        return SHARED_GROUP
    raise RegistryError(
        f"{SHARED_GROUP_ENV} is {raw!r}; expected 1 (the registry's files are shared with the group of its folder: "
        "folders 2770, database 0660, blobs 0440) or 0 (private to their owner, the default).",
        setting=SHARED_GROUP_ENV,
    )


def make_folder(path: Path, modes: FileModes | None = None) -> None:
    """Create the folder `path`, and each missing folder above it, with `modes.folder`; existing ones are left alone."""
    modes = modes or current()
    path = Path(path)
    if path.is_dir():
        return
    if not path.parent.is_dir():
        make_folder(path.parent, modes)
    try:
        path.mkdir(mode=modes.folder & 0o777)
    except FileExistsError:
        if not path.is_dir():
            raise
        return  # made meanwhile by another process
    if modes.shared:  # mkdir takes no setgid bit and the umask may have taken the group's: set exactly
        os.chmod(path, modes.folder)


def create_file(path: Path, modes: FileModes | None = None) -> None:
    """Create the empty file `path` with `modes.file` unless it exists (SQLite then opens it as a new database, and
    gives its journals the same mode)."""
    modes = modes or current()
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), modes.file)
    except FileExistsError:
        return
    try:
        if modes.shared:
            os.fchmod(handle, modes.file)
    finally:
        os.close(handle)


__all__ = ["FileModes", "PRIVATE", "SHARED_GROUP", "SHARED_GROUP_ENV", "create_file", "current", "make_folder"]
