"""Large `.pt2` payloads as tensors mapped from the archive file, and where each program tensor's bytes can be read
again.

torch.export.save stores payloads uncompressed, so a large one is mapped copy-on-write straight from the file:
the tensor costs no memory until its pages are read, and only the few a registration reads (the normalizers'
state, which the recognizers and the gate use) are ever resident. The registry streams every other tensor from
the archive into its blob (converters/tensor_bytes.py), so registering a 1 GB checkpoint never holds 1 GB. A
compressed, small or misaligned payload is read into memory as before (archive.py reads it and checks its CRC).
A mapped payload's CRC is checked when its bytes are streamed; its length, its bounds in the file and the name in its
local header (as zipfile checks it) are checked here, before anything is mapped. A file truncated by another process
while it is mapped would end the process (SIGBUS) when a lost page is read: registrations read files they were given
(a server's uploads live in its own workspace).
"""

from __future__ import annotations

import struct
import weakref
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from schemas import InputFileError

from ...tensor_bytes import ZipEntryBytes

#: Payloads at least this large are mapped rather than read (smaller ones cost less read than mapped).
MAPPED_BYTES = 1024 * 1024
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then (after 22 bytes) file name and extra field lengths
_LOCAL_SIGNATURE = b"PK\x03\x04"

#: program -> {tensor fqn: its bytes in the archive}, for the programs archive.py loaded from a file.
_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def mappable(path: Path | None, info: zipfile.ZipInfo, element_size: int) -> bool:
    """Whether the payload can be mapped: stored plainly in a file, large, and its data aligned to its elements."""
    return (
        path is not None
        and info.compress_type == zipfile.ZIP_STORED
        and info.file_size >= MAPPED_BYTES
        and info.file_size % element_size == 0
    )


def mapped_bytes(path: Path, info: zipfile.ZipInfo, element_size: int) -> np.ndarray | None:
    """The payload's bytes as a copy-on-write uint8 map of the file, or None when its data is not aligned to its
    elements.

    Raises:
        InputFileError: the entry's local header is not where the zip's directory says, or its data runs past the file.
    """
    where = f"'{path}' entry '{info.filename}'"
    try:
        with open(path, "rb") as handle:
            handle.seek(info.header_offset)
            header = handle.read(_LOCAL_HEADER.size + len(info.orig_filename.encode("utf-8")) + 1024)
            size = handle.seek(0, 2)
    except OSError as error:
        raise InputFileError(f"{where} cannot be read ({error}); check the file.") from error
    if len(header) < _LOCAL_HEADER.size or _LOCAL_HEADER.unpack(header[: _LOCAL_HEADER.size])[0] != _LOCAL_SIGNATURE:
        raise InputFileError(f"{where} has no local header at byte {info.header_offset}; the archive is corrupt.")
    _, name_length, extra_length = _LOCAL_HEADER.unpack(header[: _LOCAL_HEADER.size])
    name = header[_LOCAL_HEADER.size : _LOCAL_HEADER.size + name_length]
    utf8 = int.from_bytes(header[6:8], "little") & 0x800  # the local header's own flag, as zipfile reads it
    if name.decode("utf-8" if utf8 else "cp437", "replace") != info.orig_filename:
        raise InputFileError(
            f"{where} has the name {name[:100]!r} in its local header; the archive is corrupt."
        )  # zipfile's own check
    start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    if info.compress_size != info.file_size or start + info.file_size > size:
        raise InputFileError(
            f"{where} declares {info.file_size} bytes from byte {start}, past the end of the {size}-byte file; "
            "the archive is corrupt."
        )
    if start % element_size:
        return None
    return np.memmap(path, dtype=np.uint8, mode="c", offset=start, shape=(info.file_size,))


def contiguous_range(view: Any, meta: dict, element_size: int) -> tuple[int, int] | None:
    """(first byte, byte length) of the payload that hold `view`'s elements in C order,
    or None when they are not one range."""
    if not view.is_contiguous():
        return None
    return meta["offset"] * element_size, view.numel() * element_size


def remember(program: Any, sources: dict[str, ZipEntryBytes]) -> None:
    """Record where the tensors of `program` (by fqn) are in its archive."""
    if sources:
        _SOURCES[program] = dict(sources)


def tensor_sources(program: Any) -> dict[str, ZipEntryBytes]:
    """{fqn: where its bytes are in the archive} for the mapped tensors of a program archive.py loaded from a file;
    {} otherwise."""
    try:
        return dict(_SOURCES.get(program, {}))
    except TypeError:  # not weak-referenceable: not a program this reader loaded
        return {}


__all__ = ["MAPPED_BYTES", "contiguous_range", "mappable", "mapped_bytes", "remember", "tensor_sources"]
