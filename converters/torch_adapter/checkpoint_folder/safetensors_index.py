"""The tensors of a checkpoint's safetensors files: for each, its file, dtype, shape and byte range, from the headers.

Nothing claimed is trusted: a header's length is bounded before it is read (safetensors' own 100 MB limit) and by the
file's size, every tensor's range must lie inside the file's data and hold exactly its shape's bytes, ranges must not
overlap, and an index (`model.safetensors.index.json`) may name only plain files of the folder that exist and hold the
tensors it maps to them. A tensor is read from its range alone (`read_tensor`), never by mapping or decoding a file.

Nothing here imports torch until a tensor is read (`read_tensor`, `TensorEntry.torch_dtype`): a registration lists the
ranges and streams them into the blob store while torch and transformers are still being imported
(registry/early_staging.py).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from schemas import InputFileError

from .folder_checks import CheckedFolder

if TYPE_CHECKING:
    import torch

#: safetensors' own bound on a header (its Rust reader refuses larger ones).
MAX_HEADER_BYTES = 100 * 1024 * 1024
#: An index maps names to files: megabytes at most, even for a model of thousands of tensors.
MAX_INDEX_BYTES = 64 * 1024 * 1024

#: safetensors dtype code -> (torch's name of the dtype, bytes per element).
DTYPES = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes are: `length` bytes from byte `start` of `file`."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    length: int

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, DTYPES[self.dtype][0])


def read_header(file: Path) -> dict[str, TensorEntry]:
    """Every tensor of one safetensors file, its range checked against the file's size."""
    size = file.stat().st_size
    with open(file, "rb") as stream:
        head = stream.read(8)
        if len(head) < 8:
            raise InputFileError(f"'{file}' is shorter than a safetensors header; save it again with safetensors.")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise InputFileError(
                f"'{file}' claims a {length}-byte safetensors header in a {size}-byte file; the file is truncated or "
                "not safetensors: save it again."
            )
        raw = stream.read(length)
    return parse_header(file, raw, 8 + length, size - 8 - length)


def parse_header(file: Path, raw: bytes, data_start: int, data_size: int | None) -> dict[str, TensorEntry]:
    """The tensors a header's JSON `raw` lists, each placed at `data_start` plus its offsets; with `data_size` (the
    bytes after the header), each range must end inside them."""
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise InputFileError(f"'{file}' has a safetensors header that is not JSON ({error}); save it again.") from None
    if not isinstance(header, dict):
        raise InputFileError(f"'{file}' has a safetensors header that is not a JSON object; save it again.")
    entries = {
        name: _entry(file, name, value, data_start, data_size)
        for name, value in header.items()
        if name != "__metadata__"
    }
    _check_disjoint(file, entries)
    return entries


def _entry(file: Path, name: str, value: object, data_start: int, data_size: int | None) -> TensorEntry:
    if not isinstance(value, dict):
        raise InputFileError(f"'{file}': tensor '{name}' has no dtype, shape and offsets in its header; save it again.")
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if dtype not in DTYPES:
        raise InputFileError(
            f"'{file}': tensor '{name}' has dtype {dtype!r}, which normbridge does not read; "
            f"expected one of {', '.join(DTYPES)}."
        )
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise InputFileError(f"'{file}': tensor '{name}' has shape {shape!r}, not a list of sizes; save it again.")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
        raise InputFileError(
            f"'{file}': tensor '{name}' has data_offsets {offsets!r}, not [begin, end]; save it again."
        )
    begin, end = offsets
    if begin > end or (data_size is not None and end > data_size):
        raise InputFileError(
            f"'{file}': tensor '{name}' claims bytes {begin}..{end} of a {data_size}-byte data section (past the "
            "file's end); the file is truncated or corrupt: save it again."
        )
    expected = math.prod(shape) * DTYPES[dtype][1]
    if end - begin != expected:
        raise InputFileError(
            f"'{file}': tensor '{name}' ({dtype}, shape {shape}) needs {expected} bytes but its header gives it "
            f"{end - begin}; save it again."
        )
    return TensorEntry(name, file, dtype, tuple(shape), data_start + begin, end - begin)


def _check_disjoint(file: Path, entries: dict[str, TensorEntry]) -> None:
    previous = None
    for entry in sorted(entries.values(), key=lambda e: (e.start, e.length)):
        if previous is not None and entry.length and entry.start < previous.start + previous.length:
            raise InputFileError(
                f"'{file}': tensors '{previous.name}' and '{entry.name}' claim the same bytes; save it again."
            )
        if entry.length:
            previous = entry


def read_index(index: Path) -> dict[str, TensorEntry]:
    """Every tensor of a sharded checkpoint: the index's weight map, each name found in its shard's header."""
    folder = index.parent
    if index.stat().st_size > MAX_INDEX_BYTES:
        raise InputFileError(
            f"'{index}' is larger than {MAX_INDEX_BYTES} bytes, far more than an index needs; save it again."
        )
    try:
        weight_map = json.loads(index.read_bytes()).get("weight_map")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as error:
        raise InputFileError(f"'{index}' is not a safetensors index ({error}); save the checkpoint again.") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InputFileError(f"'{index}' has no weight_map of tensor names to file names; save the checkpoint again.")
    headers: dict[str, dict[str, TensorEntry]] = {}
    for shard in sorted(set(weight_map.values())):
        if Path(shard).name != shard or shard in (".", "..") or not shard.endswith(".safetensors"):
            raise InputFileError(
                f"'{index}' names the shard '{shard}', which is not a .safetensors file of its folder; "
                "save the checkpoint again."
            )
        if not (folder / shard).is_file():
            raise InputFileError(
                f"'{index}' names the shard '{shard}', which is not in '{folder}'; copy the whole checkpoint folder."
            )
        headers[shard] = read_header(folder / shard)
    entries = {}
    for name, shard in weight_map.items():
        entry = headers[shard].get(name)
        if entry is None:
            raise InputFileError(
                f"'{index}' puts tensor '{name}' in '{shard}', which does not hold it; save the checkpoint again."
            )
        entries[name] = entry
    return entries


def checked_tensors(folder: CheckedFolder) -> dict[str, TensorEntry]:
    """Every tensor of a checked folder's weights: its index's, else its one file's."""
    return read_index(folder.index) if folder.index is not None else read_header(folder.single)


def read_tensor(entry: TensorEntry) -> torch.Tensor:
    """The tensor at `entry`'s byte range, read alone (the file's size was checked when its header was read)."""
    import torch

    with open(entry.file, "rb") as stream:
        stream.seek(entry.start)
        data = bytearray(stream.read(entry.length))
    if len(data) != entry.length:
        raise InputFileError(f"'{entry.file}' ended inside tensor '{entry.name}'; the file changed while it was read.")
    if not data:
        return torch.empty(entry.shape, dtype=entry.torch_dtype)
    return torch.frombuffer(data, dtype=entry.torch_dtype).reshape(entry.shape).clone()


__all__ = [
    "DTYPES",
    "MAX_HEADER_BYTES",
    "TensorEntry",
    "checked_tensors",
    "parse_header",
    "read_header",
    "read_index",
    "read_tensor",
]
