"""A checkpoint folder as the registry keeps it beside its tensors, and the same folder written back, byte for byte.

The structure (format `hf-folder`) is: every file of the folder that is not a weight shard, as it is (`files/<path>`:
config.json, generation_config.json, the tokenizer's files, the index), each shard's header bytes as they are
(`headers/<shard>`: the 8-byte length, the JSON and its padding), and `layout.json`, which lists each shard's tensors in
the order their bytes follow the header, each under its name in the file and its name in the model (the manifest's).
A shard is rewritten as its header then its tensors' bytes, so a shard whose data section its tensors fill exactly
(what safetensors writes and its reader requires) comes back byte-identical; one with gaps or trailing bytes is refused
at registration. Nothing here is code: the parts are JSON and raw bytes, each checked again when a bundle brings them
(`check_folder_parts`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from schemas import InputFileError
from schemas.safetensors_io import SAFETENSORS_DTYPES

from ...model_structure import StructureParts, little_endian_view
from .folder_checks import CODE_SUFFIXES, CONFIG, PICKLE_SUFFIXES, CheckedFolder
from .safetensors_index import MAX_HEADER_BYTES, TensorEntry, parse_header

FORMAT = "hf-folder"
LAYOUT = "layout.json"
FILES = "files/"
HEADERS = "headers/"
#: A kept file is read whole into the version's structure: tokenizers and configs are megabytes, not more.
MAX_KEPT_FILE = 64 * 1024 * 1024
MAX_KEPT_TOTAL = 256 * 1024 * 1024


def folder_structure(folder: CheckedFolder, named: Mapping[str, TensorEntry]) -> StructureParts:
    """The parts of `folder`'s structure; `named`: every tensor of its shards under the model's names."""
    by_file: dict[Path, list[tuple[str, TensorEntry]]] = {}
    for model_name, entry in named.items():
        by_file.setdefault(entry.file, []).append((model_name, entry))
    parts: dict[str, bytes] = {}
    shards = []
    for file in sorted(by_file, key=lambda f: f.name):
        header, entries = _shard_layout(file, sorted(by_file[file], key=lambda pair: pair[1].start))
        parts[HEADERS + file.name] = header
        shards.append({"file": file.name, "tensors": entries})
    parts.update(_kept_files(folder, {file.resolve() for file in by_file}))
    parts[LAYOUT] = json.dumps({"format": FORMAT, "shards": shards}, indent=1).encode()
    return StructureParts(FORMAT, parts, read_safely=True)


def _shard_layout(file: Path, tensors: list[tuple[str, TensorEntry]]) -> tuple[bytes, list[list]]:
    """The shard's header bytes and its tensors in file order; refused when its data has bytes no tensor holds."""
    with open(file, "rb") as stream:
        length = int.from_bytes(stream.read(8), "little")
        header = stream.read(8 + length)[:length]
    position, size = 8 + length, file.stat().st_size
    entries = []
    for model_name, entry in tensors:
        if entry.start != position:
            break
        entries.append([entry.name, model_name])
        position += entry.length
    if position != size or len(entries) != len(tensors):
        raise InputFileError(
            f"'{file}' has bytes between or after its tensors that no tensor holds (byte {position} of {size}); "
            "safetensors does not write such files: save the checkpoint again with `save_pretrained`."
        )
    return length.to_bytes(8, "little") + header, entries


def _kept_files(folder: CheckedFolder, shards: set[Path]) -> dict[str, bytes]:
    """Every other file of the folder, by its path inside it (a symlink to a file inside it is kept as that file)."""
    kept, total = {}, 0
    for path in sorted(folder.root.rglob("*")):
        if not path.is_file() or path.resolve() in shards:
            continue
        relative = path.relative_to(folder.root).as_posix()
        size = path.stat().st_size
        total += size
        if size > MAX_KEPT_FILE or total > MAX_KEPT_TOTAL:
            raise InputFileError(
                f"'{path}' is {size} bytes, and the registry keeps a checkpoint's files other than its weights whole "
                f"(at most {MAX_KEPT_FILE >> 20} MiB each, {MAX_KEPT_TOTAL >> 20} MiB in all); move it out of the folder."
            )
        kept[FILES + relative] = path.read_bytes()
    return kept


def layout_order(parts: Mapping[str, bytes]) -> list[str]:
    """The model's tensor names in the order the folder's shards hold them (the order `write_folder` asks for them)."""
    return [model_name for shard in _layout(parts)["shards"] for _, model_name in shard["tensors"]]


def write_folder(parts: Mapping[str, bytes], tensors: Mapping[str, np.ndarray], target: Path) -> int:
    """Write the folder of `parts` into the empty folder `target`, each tensor's bytes from `tensors` (by model name),
    every file fsynced; the bytes written."""
    written = 0
    for name, data in parts.items():
        if name.startswith(FILES):
            written += _write_file(target / name[len(FILES) :], [data])
    for shard in _layout(parts)["shards"]:
        header = parts[HEADERS + shard["file"]]
        chunks = (little_endian_view(tensors[model_name]) for _, model_name in shard["tensors"])
        written += _write_file(target / shard["file"], [header], chunks)
    return written


def _write_file(path: Path, *sources) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(path, "xb") as stream:
        for source in sources:
            for chunk in source:
                written += stream.write(chunk)
        stream.flush()
        os.fsync(stream.fileno())
    return written


def check_folder_parts(parts: Mapping[str, bytes], tensors: Mapping[str, tuple[str, list[int]]]) -> None:
    """The parts of a folder structure from a bundle (hostile until checked) are ones `write_folder` turns into the
    folder they claim: `tensors`, the manifest's (dtype, shape) by name. InputFileError naming what is not."""
    layout = _layout(parts)
    listed = {LAYOUT}
    for name in parts:
        if name.startswith(FILES):
            path = PurePosixPath(name[len(FILES) :])
            if path.is_absolute() or ".." in path.parts or not path.parts:
                raise InputFileError(f"the folder structure keeps a file at '{path}', outside the folder.")
            if path.suffix.lower() in PICKLE_SUFFIXES + CODE_SUFFIXES:
                raise InputFileError(
                    f"the folder structure keeps '{path}', a pickle or code file normbridge never writes."
                )
            listed.add(name)
    config = parts.get(FILES + CONFIG)
    if config is None:
        raise InputFileError(f"the folder structure keeps no {CONFIG}.")
    _config_without_code(config)
    placed: set[str] = set()
    for shard in layout["shards"]:
        file = shard.get("file") if isinstance(shard, dict) else None
        header = parts.get(HEADERS + str(file))
        if (
            not isinstance(file, str)
            or PurePosixPath(file).name != file
            or not file.endswith(".safetensors")
            or header is None
        ):
            raise InputFileError(
                f"the folder structure lists the shard {file!r} without its header, or outside the folder."
            )
        listed.add(HEADERS + file)
        if FILES + file in parts:
            raise InputFileError(f"the folder structure holds '{file}' both as a kept file and as a shard.")
        _check_shard(file, header, shard.get("tensors"), tensors, placed)
    unknown = sorted(set(parts) - listed)
    if unknown:
        raise InputFileError(f"the folder structure holds parts it does not use ({', '.join(unknown[:3])}).")


def _check_shard(
    file: str, header: bytes, listed: Any, tensors: Mapping[str, tuple[str, list[int]]], placed: set[str]
) -> None:
    """The shard's header holds exactly the listed tensors, in that order, filling its data; each is the manifest's."""
    if len(header) < 8 or int.from_bytes(header[:8], "little") != len(header) - 8 or len(header) - 8 > MAX_HEADER_BYTES:
        raise InputFileError(f"the folder structure's header of '{file}' does not give its own length.")
    if not isinstance(listed, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in listed
    ):
        raise InputFileError(
            f"the folder structure's layout of '{file}' is not a list of [file name, model name] pairs."
        )
    entries = parse_header(Path(file), header[8:], len(header), None)
    position = 0
    for file_name, model_name in listed:
        entry = entries.pop(file_name, None)
        if entry is None or entry.start - len(header) != position:
            raise InputFileError(
                f"the folder structure puts '{file_name}' in '{file}', whose header does not hold it there."
            )
        if model_name in placed or model_name not in tensors:
            raise InputFileError(
                f"the folder structure writes tensor '{model_name}' twice, or one the version does not hold."
            )
        dtype, shape = tensors[model_name]
        if SAFETENSORS_DTYPES.get(entry.dtype) != dtype or list(entry.shape) != list(shape):
            raise InputFileError(
                f"the folder structure writes '{model_name}' as {entry.dtype}{list(entry.shape)}; the version holds "
                f"{dtype}{list(shape)}."
            )
        placed.add(model_name)
        position += entry.length
    if entries:
        raise InputFileError(
            f"the header of '{file}' holds tensors the folder structure does not write ({', '.join(sorted(entries)[:3])})."
        )


def _config_without_code(data: bytes) -> None:
    from .meta_model import refuse_code_in_config

    try:
        config = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise InputFileError(f"the folder structure's {CONFIG} is not JSON.") from None
    if not isinstance(config, dict):
        raise InputFileError(f"the folder structure's {CONFIG} is not a JSON object.")
    refuse_code_in_config(CONFIG, config)


def _layout(parts: Mapping[str, bytes]) -> dict:
    try:
        layout = json.loads(parts[LAYOUT])
    except (KeyError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise InputFileError(f"the folder structure has no readable {LAYOUT}.") from None
    if not isinstance(layout, dict) or layout.get("format") != FORMAT or not isinstance(layout.get("shards"), list):
        raise InputFileError(f"the folder structure's {LAYOUT} is not a {FORMAT} layout.")
    return layout


__all__ = ["FORMAT", "check_folder_parts", "folder_structure", "layout_order", "write_folder"]
