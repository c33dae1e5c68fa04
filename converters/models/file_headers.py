"""Refusing a file that is not what its suffix says before any of it is read into memory.

A 3 GB file that is not a model was read whole (`onnx.load` parses from bytes in memory; Keras and
NumPy read before they fail) and only then refused. Each format is told from its first bytes and
a few seeks, reading kilobytes whatever the size:

- `.pt2`, `.keras`, `.npz` are zip archives: the local-file magic `PK\\x03\\x04` (or an empty
  archive's `PK\\x05\\x06`) and an end-of-central-directory record that `zipfile` finds at the end.
- `.onnx` is a protobuf `ModelProto`: the top-level fields are walked by their tags and lengths,
  seeking over each body; every tag must be well formed, every length must fit in the file, the
  fields must end exactly at the end of the file, and the graph (field 7) must be there.
- `.npy`: the magic `\\x93NUMPY`, a header NumPy parses, no object dtype (that is a pickle), and
  the file at least as long as the array its header declares.

A file that passes is then loaded as before; these checks only make the refusal of the others
cheap. Nothing here imports a framework.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np

from schemas import InputFileError

from ..adapters import REGISTRY

ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
NPY_MAGIC = b"\x93NUMPY"
#: ModelProto field number -> protobuf wire type (onnx/onnx.proto); unknown numbers are allowed
#: (newer ONNX) if well formed.
ONNX_MODEL_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2, 26: 2}
ONNX_GRAPH_FIELD = 7
#: More top-level fields than this is not a model a tool wrote (opset imports and metadata entries are few).
MAX_TOP_LEVEL_FIELDS = 100_000
#: Wire types: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit (3 and 4, groups, do not occur in ONNX).
_FIXED = {1: 8, 5: 4}


def _varint(handle: BinaryIO) -> int | None:
    """A protobuf varint at the handle's position, or None when it is malformed or cut off."""
    value = 0
    for shift in range(0, 70, 7):
        byte = handle.read(1)
        if not byte:
            return None
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
    return None


def _onnx_problem(handle: BinaryIO, size: int) -> str | None:
    """Why the file is not a serialized ModelProto, or None when its top level is well formed."""
    if size == 0:
        return "the file is empty"
    seen: set[int] = set()
    for _ in range(MAX_TOP_LEVEL_FIELDS):
        at = handle.tell()
        if at == size:
            return None if ONNX_GRAPH_FIELD in seen else "it holds no graph (ModelProto field 7)"
        tag = _varint(handle)
        if tag is None or tag >> 3 == 0:
            return f"byte {at} does not start a protobuf field"
        number, wire = tag >> 3, tag & 7
        expected = ONNX_MODEL_FIELDS.get(number)
        if wire not in (0, 1, 2, 5) or (expected is not None and wire != expected):
            return f"field {number} at byte {at} has wire type {wire}, which a ModelProto does not use there"
        if wire == 0:
            if _varint(handle) is None:
                return f"field {number} at byte {at} is cut off"
            continue
        length = _FIXED.get(wire) or _varint(handle)
        if length is None or handle.tell() + length > size:
            return f"field {number} at byte {at} claims more bytes than the file holds"
        handle.seek(length, 1)
        seen.add(number)
    return f"it has more than {MAX_TOP_LEVEL_FIELDS} top-level fields"


def check_onnx_header(path: Path) -> None:
    """Refuse a file whose top level is not a serialized onnx.ModelProto (reads tags and lengths only)."""
    with path.open("rb") as handle:
        problem = _onnx_problem(handle, path.stat().st_size)
    if problem is not None:
        raise InputFileError(
            f"'{path}' is not an ONNX model ({problem}); expected a file written by onnx.save or save_onnx."
        )


def check_zip_header(path: Path, what: str, fix: str) -> None:
    """Refuse a file that is not a zip archive: its magic bytes, then the central directory record at its end."""
    with path.open("rb") as handle:
        magic = handle.read(4)
    if not magic:
        found = "it is empty"
    elif magic not in ZIP_MAGICS:
        found = f"it starts with {magic!r}, not {ZIP_MAGICS[0]!r}"
    elif not zipfile.is_zipfile(path):
        found = "no end-of-central-directory record at its end: cut off, or not an archive"
    else:
        return
    raise InputFileError(f"'{path}' is not {what} (not a zip file: {found}); {fix}.")


def check_npy_header(path: Path) -> None:
    """Refuse a .npy whose magic or header is wrong, whose dtype needs unpickling,
    or that is shorter than its header says."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        if handle.read(len(NPY_MAGIC)) != NPY_MAGIC:
            raise InputFileError(
                f"sample file '{path}' is not a NumPy .npy file (no \\x93NUMPY magic at its start); save it with numpy.save."
            )
        handle.seek(0)
        try:
            version = np.lib.format.read_magic(handle)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(handle, max_header_size=10_000)
        except (ValueError, SyntaxError) as error:
            raise InputFileError(
                f"sample file '{path}' has a malformed .npy header ({error}); save it with numpy.save."
            ) from None
        data_start = handle.tell()
    if dtype.hasobject:
        raise InputFileError(
            f"sample file '{path}' holds object arrays, which can only be read by unpickling (refused: it can execute code); save plain numeric arrays."
        )
    needed = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size - data_start < needed:
        raise InputFileError(
            f"sample file '{path}' is cut off: its header declares {dtype}{list(shape)} ({needed} bytes), the file holds "
            f"{size - data_start}; save it again with numpy.save."
        )


#: Model file suffix -> the check of a format that is no zip archive (the archives are each FrameworkInfo's `archive`).
CONTENT_HEADERS: dict[str, Callable[[Path], None]] = {".onnx": check_onnx_header}
SAMPLE_HEADERS: dict[str, Callable[[Path], None]] = {
    ".npy": check_npy_header,
    ".npz": lambda path: check_zip_header(path, "a NumPy .npz file", "save it with numpy.savez"),
}


def model_headers() -> dict[str, Callable[[Path], None]]:
    """Model file suffix -> the check of its first bytes, for every registered framework's archive files and the
    formats of CONTENT_HEADERS."""
    checks = dict(CONTENT_HEADERS)
    for info in REGISTRY.infos():
        if info.archive is not None:
            what, advice = info.archive
            for suffix in info.model_files:
                checks[suffix] = lambda path, what=what, advice=advice: check_zip_header(path, what, advice)
    return checks


def check_model_header(path: str | Path) -> None:
    """Refuse a model file whose first bytes do not match its suffix (no-op for suffixes without a check)."""
    path = Path(path)
    check = model_headers().get(path.suffix.lower())
    if check is not None and path.is_file():
        check(path)


def check_sample_header(path: str | Path) -> None:
    """Refuse a .npy/.npz sample whose first bytes do not match its suffix (no-op for other paths)."""
    path = Path(path)
    check = SAMPLE_HEADERS.get(path.suffix.lower())
    if check is not None and path.is_file():
        check(path)


__all__ = ["check_model_header", "check_npy_header", "check_onnx_header", "check_sample_header", "check_zip_header"]
