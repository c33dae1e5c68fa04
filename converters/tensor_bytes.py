"""Where a model tensor's bytes can be read again, in chunks, without holding them: so a registration streams them.

A model file read for registration keeps its large tensors where they are (a `.pt2` payload is mapped, never read
whole: torch_adapter/pt2/payloads.py: `ZipEntryBytes`; a checkpoint folder's tensors stay in their safetensors files:
`FileRangeBytes`) and names, per tensor, the range of the file that holds its C-order little-endian bytes. The
registry hashes each blob from that range and stages it from it again (registry/artifact.py, registry/tensor_blobs.py),
or, for a checkpoint folder on a local store, in one pass while the folder is read (registry/early_staging.py), a chunk
at a time, so the peak memory of registering a checkpoint does not grow with it. Nothing here imports torch.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from schemas import InputFileError

#: Bytes read at a time when a tensor is streamed.
CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ZipEntryBytes:
    """`length` bytes from byte `start` of the entry `entry` of the zip file `archive`.

    Read through `zipfile`, so a range that ends at the entry's end has the entry's CRC checked on the way: a corrupt
    payload is refused when it is streamed, and a file changed since it was read is refused by its digest.
    """

    archive: Path
    entry: str
    start: int
    length: int

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The range's bytes, at most `size` at a time; InputFileError if the entry is shorter or corrupt."""
        where = f"'{self.archive}' entry '{self.entry}'"
        try:
            with zipfile.ZipFile(self.archive) as zf, zf.open(self.entry) as stream:
                skip = self.start
                while skip:
                    skipped = len(stream.read(min(size, skip)))
                    if not skipped:
                        break
                    skip -= skipped
                left = self.length
                while left:
                    chunk = stream.read(min(size, left))
                    if not chunk:
                        break
                    left -= len(chunk)
                    yield chunk
                if not left and not skip and self.start + self.length == zf.getinfo(self.entry).file_size:
                    stream.read(1)  # reaching the end checks the entry's CRC
        except (zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError) as error:
            raise InputFileError(
                f"{where} cannot be read again ({error}); the archive is corrupt or changed while it was registered."
            ) from error
        if skip or left:
            raise InputFileError(
                f"{where} ended before byte {self.start + self.length}; the archive is corrupt or changed while it was registered."
            )


@dataclass(frozen=True)
class FileRangeBytes:
    """`length` bytes from byte `start` of `file`: a safetensors tensor's C-order little-endian bytes."""

    file: Path
    start: int
    length: int

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The range's bytes, at most `size` at a time; InputFileError if the file ends first."""
        left = self.length
        with open(self.file, "rb") as stream:
            stream.seek(self.start)
            while left:
                chunk = stream.read(min(size, left))
                if not chunk:
                    raise InputFileError(
                        f"'{self.file}' ended before byte {self.start + self.length}; the file changed while it was "
                        "registered."
                    )
                left -= len(chunk)
                yield chunk


__all__ = ["CHUNK_BYTES", "FileRangeBytes", "ZipEntryBytes"]
