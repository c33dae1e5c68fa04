"""Atomic writes: a temporary sibling, fsync, rename. A failed write leaves nothing behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `target` so that readers see the old file or the whole new one, never a part."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def atomic_write_folder(target: str | os.PathLike, fill: Callable[[Path], object]) -> Path:
    """Let `fill` populate a temporary sibling folder, then move it to `target` (replacing it)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        fill(temporary)
        if target.exists():
            shutil.rmtree(target)
        os.replace(temporary, target)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return target
