"""A zip entry as a seekable file that costs no memory: what h5py reads a `.keras` file's weights metadata through.

HDF5 seeks back and forth through a file; `zipfile` answers a backward seek by reading the entry again from its start
(Python 3.11), and reading the entry whole costs as much memory as the weights. `model.save` stores entries plainly,
so a stored entry is read straight from the archive: a window on the file from the entry's data to its declared end.
A compressed entry (a hand-made archive; its ratio is bounded by keras_file_checks) is read whole.
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from schemas import InputFileError

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then (after 22 bytes) the file name and extra field lengths
_LOCAL_SIGNATURE = b"PK\x03\x04"


class _Window(io.RawIOBase):
    """Bytes [start, start + size) of `handle`, as a read-only file of `size` bytes."""

    def __init__(self, handle: BinaryIO, start: int, size: int):
        super().__init__()
        self.handle, self.start, self.size, self.position = handle, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        wanted = max(0, min(len(buffer), self.size - self.position))
        self.handle.seek(self.start + self.position)
        got = self.handle.readinto(memoryview(buffer)[:wanted])
        self.position += got
        return got

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def tell(self) -> int:
        return self.position


@contextmanager
def entry_file(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[BinaryIO]:
    """The entry `info` of the archive at `path` (opened as `archive`) as a seekable file of `info.file_size` bytes.

    Raises:
        InputFileError: the entry's local header is not where the central directory says,
            or its data runs past the file.
    """
    if info.compress_type != zipfile.ZIP_STORED:
        yield io.BytesIO(archive.read(info))
        return
    where = f"'{path}' entry '{info.filename}'"
    with open(path, "rb") as handle:
        handle.seek(info.header_offset)
        header = handle.read(_LOCAL_HEADER.size)
        if len(header) < _LOCAL_HEADER.size or _LOCAL_HEADER.unpack(header)[0] != _LOCAL_SIGNATURE:
            raise InputFileError(
                f"{where} has no local header at byte {info.header_offset}; the archive is corrupt, save it again."
            )
        _, name_length, extra_length = _LOCAL_HEADER.unpack(header)
        start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
        end = handle.seek(0, io.SEEK_END)
        if info.compress_size != info.file_size or start + info.file_size > end:
            raise InputFileError(
                f"{where} declares {info.file_size} bytes from byte {start}, past the end of the {end}-byte file; "
                "the archive is corrupt, save it again."
            )
        yield _Window(handle, start, info.file_size)


__all__ = ["entry_file"]
