"""Reading a torch.export `.pt2` archive without running anything stored in it.

`torch.export.load` is not safe for a file from elsewhere: it unpickles the sample inputs and a
legacy state dict with `weights_only=False` when the weights-only load fails, unpickles
`use_pickle` payloads and opaque constants with the full unpickler, loads AOTInductor shared
libraries, and trusts every string of the JSON program (see `program_checks`). This reader opens the
archive with `zipfile` itself and takes only what an ExportedProgram needs:

- `models/model.json`, checked by `program_checks.check_program` before torch sees it;
- tensors of the weights and constants configs, built from their raw bytes (dtype, sizes, strides and offset from the
  config, checked by tensors.py; a large stored payload mapped from the file, not read: payloads.py), each payload
  holding every element its tensor claims (torch makes zeros of any claimed size for an empty one), and what they all
  claim counted like unpacked bytes before any is made; a legacy `model.pt` state dict only through
  `torch.load(weights_only=True)`;
- never the sample inputs (their pickle is only scanned statically, by
  `torch.serialization.get_unsafe_globals_in_checkpoint`, so a hostile one is refused), extra files or other models.
  Entries that only a full unpickler or a native loader reads (`use_pickle`, custom and opaque objects,
  AOTInductor/ExecuTorch code) are refused with `InputFileError` naming the entry.

The parts are handed to torch's `ExportedProgramDeserializer`, so the result is the same
`torch.export.ExportedProgram` that `torch.export.load` returns for a genuine file (without
`example_inputs`), and its graph is checked again by `program_checks.check_graph`.

Every step reads bytes from the file, so any exception one raises (zipfile, json, torch and sympy raise dozens of types
for bytes they did not expect) becomes an InputFileError naming the entry it was reading (`_reading`): a malformed
archive is a bad input file, never a crash.
"""

from __future__ import annotations

import io
import json
import re
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas import InputFileError, NormbridgeError

from ...tensor_bytes import ZipEntryBytes
from .payloads import contiguous_range, mappable, mapped_bytes, remember
from .program_checks import check_graph, check_program, is_fqn
from .tensors import ClaimedBytes, claimed_bytes, numel, parameter, tensor_meta, view
from .treespecs import read_as_dicts
from .versions import check_schema_version

MAX_ENTRIES = 100_000
MAX_TOTAL_BYTES = 32 * 1024**3  # what all entries may unpack to: a zip bomb is refused before reading
MAX_JSON_BYTES = 512 * 1024**2
#: A deflated entry may unpack to at most this many times its stored size (above MIN_BOMB_BYTES): torch.export.save
#: stores entries plainly, so only a hand-made archive compresses, and 1 MiB of deflated zeros unpacks to 1 GiB, held
#: whole by the reader of that entry. Keras refuses ratios over 100x in `.keras` files the same way.
MAX_DEFLATE_RATIO = 100
MIN_BOMB_BYTES = 1024**2
#: What the tensors claim (elements x itemsize, each view of a payload counted) may reach MAX_DEFLATE_RATIO times what
#: the archive stores, or MIN_CLAIM_BYTES when that is more, and never more than MAX_TOTAL_BYTES: a genuine stride-0
#: buffer (`ones(4).expand(1000, 4)`) claims far more than its payload, but a 14 KiB file claiming gigabytes is a bomb.
MIN_CLAIM_BYTES = 64 * 1024**2
PROGRAM = "models/model.json"
SAMPLE_INPUTS = "data/sample_inputs/"
WEIGHTS = (
    "data/weights/",
    "data/weights/model_weights_config.json",
    "data/weights/model.pt",
    re.compile(r"weight_[0-9]+"),
)
CONSTANTS = (
    "data/constants/",
    "data/constants/model_constants_config.json",
    "data/constants/model.pt",
    re.compile(r"tensor_[0-9]+"),
)
#: Folders holding compiled code for other runtimes: loading them would run native code.
COMPILED_CODE = ("data/aotinductor/", "data/executorch/", "data/mtia", "xl_model_weights/")
#: Payload names of TorchScript custom objects and opaque Python objects: both are unpickled by torch.
PICKLED_OBJECTS = ("custom_obj_", "opaque_obj_")


@dataclass(frozen=True)
class _Archive:
    """An opened archive: entry names relative to the root folder torch writes everything under."""

    path: Path
    zf: zipfile.ZipFile
    entries: dict[str, zipfile.ZipInfo]
    on_disk: bool = False  # read from the file at `path` (so its large payloads can be mapped), not from bytes

    def where(self, entry: str) -> str:
        return f"'{self.path}' entry '{entry}'"

    def read(self, entry: str, limit: int | None = None) -> bytearray:
        """The entry's bytes, at most its declared size (and `limit`); a short or corrupt entry is refused."""
        info = self.entries.get(entry)
        if info is None:
            raise InputFileError(f"'{self.path}' has no entry '{entry}'; save the model with torch.export.save.")
        if limit is not None and info.file_size > limit:
            raise InputFileError(
                f"{self.where(entry)} declares {info.file_size} bytes, more than the {limit} normbridge reads."
            )
        data = bytearray(info.file_size)
        try:
            with self.zf.open(info) as stream:
                got = stream.readinto(data)
                extra = stream.read(1)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
            raise InputFileError(f"{self.where(entry)} cannot be read ({error}); the archive is corrupt.") from error
        if got != info.file_size or extra:
            raise InputFileError(
                f"{self.where(entry)} does not hold the {info.file_size} bytes it declares; the archive is corrupt."
            )
        return data


def load_exported_program(path: str | Path, data: bytes | None = None) -> Any:
    """The torch.export.ExportedProgram stored in the `.pt2` at `path` (or in `data`, `path` then only naming it in
    messages), read without unpickling anything unsafe.

    Raises:
        InputFileError: not a readable archive, or an entry that would need code to run (named in the message).
    """
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path if data is None else io.BytesIO(data))
    except (zipfile.BadZipFile, OSError) as error:
        raise InputFileError(
            f"'{path}' is not a torch.export .pt2 archive (not a zip file: {error}); save the model with torch.export.save."
        ) from error
    except Exception as error:  # zipfile raises others for a directory it did not expect (ValueError, EOFError, ...)
        raise InputFileError(
            f"'{path}' is not a readable zip archive ({_described(error)}); save the model with torch.export.save."
        ) from error
    with zf:
        with _reading(f"'{path}'"):
            archive = _Archive(path, zf, _entries(path, zf), on_disk=data is None)
        _check_format(archive)
        document = _program(archive)
        _check_sample_inputs(archive)
        sources: dict[str, ZipEntryBytes] = {}
        claims = ClaimedBytes(*_claim_limit(archive))
        state_dict = _tensors(archive, *WEIGHTS, parameters=True, sources=sources, claims=claims)
        constants = _tensors(archive, *CONSTANTS, parameters=False, sources=sources, claims=claims)
    with _reading(f"'{path}' entry '{PROGRAM}'"):
        program = _deserialize(document, state_dict, constants)
        check_graph(program, f"'{path}' entry '{PROGRAM}'")
    remember(program, sources)
    return program


def claimed_tensor_bytes(path: Path) -> int:
    """What the tensors of the `.pt2` at `path` claim (elements x itemsize), from its payload configs alone (no payload
    is read), for a server to hold against its upload limit before the file is read; 0 when the archive cannot be read
    that far (the reader refuses it, naming why)."""
    try:
        with zipfile.ZipFile(path) as zf:
            archive = _Archive(path, zf, _entries(path, zf))
            return sum(
                claimed_bytes(meta)
                for folder, config, _, file_name in (WEIGHTS, CONSTANTS)
                if config in archive.entries
                for _, _, meta, _ in _payloads(archive, folder, config, file_name)
            )
    except Exception:  # anything the reader refuses, with a better message than this check could give
        return 0


@contextmanager
def _reading(where: str) -> Iterator[None]:
    """Any exception but normbridge's own, raised while the bytes of `where` are read,
    as an InputFileError naming it."""
    try:
        yield
    except NormbridgeError:
        raise
    except Exception as error:
        raise InputFileError(
            f"{where} cannot be read ({_described(error)}); the archive is malformed or was altered: save the "
            "model with torch.export.save."
        ) from error


def _described(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _entries(path: Path, zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """Entries by name below the single root folder; path tricks, duplicates, bombs and compiled code are refused."""
    infos = zf.infolist()
    if not infos or len(infos) > MAX_ENTRIES:
        raise InputFileError(
            f"'{path}' holds {len(infos)} entries; a torch.export .pt2 holds between 1 and {MAX_ENTRIES}."
        )
    root = infos[0].filename.split("/")[0]
    entries: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in infos:
        name = info.filename
        parts = name.split("/")
        if (
            "\\" in name
            or "\x00" in name
            or name.startswith("/")
            or parts[0] != root
            or len(parts) < 2
            or any(part in ("", ".", "..") for part in parts[1:-1])
            or parts[-1] in (".", "..")
            or root in ("", ".", "..")
        ):
            raise InputFileError(
                f"'{path}' has an entry named {name!r}; a torch.export .pt2 keeps plain names under one root folder."
            )
        if info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise InputFileError(
                f"'{path}' entry {name!r} is encrypted or compressed with method {info.compress_type}; "
                "torch.export.save stores entries plainly."
            )
        relative = name[len(root) + 1 :]
        if name.endswith("/"):
            continue  # a folder record some zip tools add
        if relative in entries:
            raise InputFileError(
                f"'{path}' holds the entry '{relative}' twice; readers would disagree on which one counts."
            )
        if relative.startswith(COMPILED_CODE):
            raise InputFileError(
                f"'{path}' entry '{relative}' is compiled code for another runtime (AOTInductor, ExecuTorch), "
                "which normbridge never loads; save the model with torch.export.save alone."
            )
        if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > max(
            MIN_BOMB_BYTES, MAX_DEFLATE_RATIO * info.compress_size
        ):
            raise InputFileError(
                f"'{path}' entry '{relative}' unpacks to {info.file_size} bytes from {info.compress_size}, more than "
                f"{MAX_DEFLATE_RATIO} times its stored size (a zip bomb); torch.export.save stores entries plainly."
            )
        total += info.file_size
        entries[relative] = info
    if total > MAX_TOTAL_BYTES:
        raise InputFileError(
            f"'{path}' entries unpack to {total} bytes, more than the {MAX_TOTAL_BYTES} normbridge reads."
        )
    return entries


def _check_format(archive: _Archive) -> None:
    if "archive_format" not in archive.entries:
        raise InputFileError(
            f"'{archive.path}' has no 'archive_format' entry: not a torch.export .pt2 archive (or one from before "
            "torch 2.6, which normbridge does not read); save the model with torch.export.save."
        )
    checks = {"archive_format": ("pt2",), "archive_version": ("0",), "byteorder": (sys.byteorder,)}
    for entry, expected in checks.items():
        if entry == "byteorder" and entry not in archive.entries:
            continue
        with _reading(archive.where(entry)):
            value = bytes(archive.read(entry, limit=64)).decode("utf-8", "replace").strip()
        if value not in expected:
            raise InputFileError(
                f"{archive.where(entry)} is {value!r}, expected {expected[0]!r}; "
                "save the model with torch.export.save on a little-endian machine with torch 2.6 or later."
            )


def _program(archive: _Archive) -> dict:
    with _reading(archive.where(PROGRAM)):
        try:
            document = json.loads(archive.read(PROGRAM, limit=MAX_JSON_BYTES))
            check_program(document, archive.where(PROGRAM))
            check_schema_version(
                document, archive.where(PROGRAM)
            )  # another torch's program: read as it was meant, or refused
        except (
            UnicodeDecodeError,
            ValueError,
            RecursionError,
        ) as error:  # InputFileError is not a ValueError: it passes through
            raise InputFileError(
                f"{archive.where(PROGRAM)} is not valid JSON of a sensible depth ({type(error).__name__}); "
                "save the model with torch.export.save."
            ) from error
        read_as_dicts(document)  # a library's output type (transformers' ModelOutput) read as a dict, never imported
    return document


def _check_sample_inputs(archive: _Archive) -> None:
    """Refuse sample inputs whose pickle names anything but tensors: scanned statically, never unpickled (nothing needs
    them). An empty entry holds nothing to run."""
    import torch

    for entry in sorted(e for e in archive.entries if e.startswith(SAMPLE_INPUTS)):
        with _reading(archive.where(entry)):
            data = archive.read(entry)
        if not data:
            # torch.export.save writes an empty entry for a program without example inputs (one loaded by this reader,
            # or what normbridge's pull writes): no pickle
            continue
        try:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data))
        except Exception as error:  # not a torch.save zip, or opcodes the static scanner does not know
            raise InputFileError(
                f"{archive.where(entry)} is not a pickle torch's static scanner can read ({type(error).__name__}), so what it would run "
                "cannot be shown safe; normbridge never unpickles sample inputs and refuses the file: re-save the model with "
                "torch.export.save from code you trust."
            ) from error
        if unsafe:
            raise InputFileError(
                f"{archive.where(entry)} holds a pickle that calls {', '.join(sorted(unsafe)[:5])}, which only the full unpickler "
                "runs and which can run code; normbridge never unpickles sample inputs and refuses the file: re-save the model "
                "with torch.export.save from code you trust."
            )


def _claim_limit(archive: _Archive) -> tuple[int, str]:
    """(the bytes the archive's tensors may claim, how the limit is described): see MIN_CLAIM_BYTES."""
    stored = sum(info.compress_size for info in archive.entries.values())
    by_ratio = max(MIN_CLAIM_BYTES, MAX_DEFLATE_RATIO * stored)
    if by_ratio < MAX_TOTAL_BYTES:
        return by_ratio, (
            f"an archive storing {stored} bytes may claim ({MAX_DEFLATE_RATIO} times what it stores, at least "
            f"{MIN_CLAIM_BYTES >> 20} MiB)"
        )
    return MAX_TOTAL_BYTES, "normbridge reads of one archive"


def _tensors(
    archive: _Archive,
    folder: str,
    config: str,
    legacy: str,
    file_name: re.Pattern,
    *,
    parameters: bool,
    sources: dict[str, ZipEntryBytes],
    claims: ClaimedBytes,
) -> dict:
    """{fqn: tensor} of one payload config (weights or constants), or of the legacy torch.save file; `sources` gets
    where the bytes of each tensor of a mapped payload are (payloads.py), `claims` what each tensor claims,
    before it is made."""
    if legacy in archive.entries:  # torch prefers the legacy file when both exist
        with _reading(archive.where(legacy)):
            loaded = _weights_only(archive, legacy)
            for name, tensor in loaded.items():  # views of the storages torch read: nothing of their claims is made yet
                claims.add(tensor.numel() * tensor.element_size(), f"{archive.where(legacy)}, '{name}'")
        return loaded
    if config not in archive.entries:
        raise InputFileError(f"'{archive.path}' has no '{config}'; save the model with torch.export.save.")
    flat: dict[str, Any] = {}
    found: dict[str, Any] = {}
    for fqn, name, meta, payload in _payloads(archive, folder, config, file_name):
        where = f"{archive.where(config)}, '{fqn}'"
        entry = folder + name
        with _reading(f"{where} (entry '{entry}')"):
            claims.add(claimed_bytes(meta), where)
            if name not in flat:
                flat[name] = _flat_tensor(archive, entry, meta, where)
            tensor, mapped = flat[name]
            seen = view(tensor, meta, f"{where} (entry '{entry}')")
            found[fqn] = parameter(seen, meta) if parameters and payload.get("is_param") is True else seen
            span = contiguous_range(seen, meta, seen.element_size()) if mapped else None
            if span is not None:
                sources[fqn] = ZipEntryBytes(archive.path, archive.entries[entry].filename, *span)
    return found


def _payloads(
    archive: _Archive, folder: str, config: str, file_name: re.Pattern
) -> Iterator[tuple[str, str, dict, dict]]:
    """(fqn, payload file name, checked tensor meta, the config's record) of every tensor of one payload config; a
    pickled payload, a name outside the payload folder or a meta torch.export.save does not write is refused."""
    with _reading(archive.where(config)):
        try:
            document = json.loads(archive.read(config, limit=MAX_JSON_BYTES))
        except (UnicodeDecodeError, ValueError, RecursionError) as error:
            raise InputFileError(f"{archive.where(config)} is not valid JSON ({error}).") from error
        payloads = document.get("config") if isinstance(document, dict) else None
        if not isinstance(payloads, dict):
            raise InputFileError(
                f"{archive.where(config)} has no 'config' object; save the model with torch.export.save."
            )
        for fqn, payload in payloads.items():
            where = f"{archive.where(config)}, '{fqn}'"
            if not is_fqn(fqn, "") or not isinstance(payload, dict):
                raise InputFileError(
                    f"{archive.where(config)} names the tensor {fqn!r}, which is not a dotted attribute path; refused."
                )
            name = payload.get("path_name")
            if payload.get("use_pickle") is not False or (isinstance(name, str) and name.startswith(PICKLED_OBJECTS)):
                raise InputFileError(
                    f"{where} is stored as a pickle (entry '{folder}{name}', use_pickle={payload.get('use_pickle')!r}), which only a full "
                    "unpickler can read and which can run code; normbridge reads raw tensors only: save plain tensors (no tensor subclasses "
                    "or custom objects) with torch.export.save."
                )
            if not isinstance(name, str) or not file_name.fullmatch(name):
                raise InputFileError(
                    f"{where} names the payload {name!r}, expected '{file_name.pattern}' in '{folder}'; the archive was altered."
                )
            yield fqn, name, tensor_meta(payload.get("tensor_meta"), where), payload


def _flat_tensor(archive: _Archive, entry: str, meta: dict, where: str) -> tuple[Any, bool]:
    """(the entry's raw bytes as a flat tensor of the payload's dtype, whether they are mapped from the file rather than
    read). torch makes zeros of the claimed sizes for an empty entry, so only a tensor without elements may have one. A
    large stored payload is mapped (payloads.py)."""
    import torch

    dtype = meta["dtype"]
    element = dtype.itemsize
    info = archive.entries.get(entry)
    data = None
    if archive.on_disk and info is not None and meta["device"][0] == "cpu" and mappable(archive.path, info, element):
        data = mapped_bytes(archive.path, info, element)
    mapped = data is not None
    if data is None:
        data = archive.read(entry)
    if not len(data):
        if numel(meta):
            raise InputFileError(
                f"{where}: the entry '{entry}' is empty, but its tensor claims {numel(meta)} elements of {dtype} (torch would "
                "make them zeros); only a tensor without elements may have an empty payload: the archive was altered."
            )
        flat = torch.zeros(meta["sizes"], dtype=dtype)
    elif len(data) % element:
        raise InputFileError(f"{archive.where(entry)} holds {len(data)} bytes, not a whole number of {dtype} elements.")
    else:
        flat = torch.from_numpy(data).view(dtype) if mapped else torch.frombuffer(data, dtype=dtype)
    if meta["requires_grad"]:
        flat.requires_grad_(True)
    kind, index = meta["device"]
    device = torch.device(kind) if index is None else torch.device(kind, index)
    return (flat, mapped) if device.type == "cpu" else (flat.to(device), False)


def _weights_only(archive: _Archive, entry: str) -> dict:
    """A legacy torch.save state dict, through torch's weights-only unpickler (never the full one)."""
    import torch

    try:
        loaded = torch.load(io.BytesIO(archive.read(entry)), weights_only=True)
    except Exception as error:  # the weights-only unpickler raises UnpicklingError and others for anything but tensors
        raise InputFileError(
            f"{archive.where(entry)} is a pickle that the weights-only unpickler refuses ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:200] if str(error) else ''}); it would need the full unpickler, which can run code: "
            "re-save the model with torch.export.save."
        ) from error
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        raise InputFileError(
            f"{archive.where(entry)} is not a dict of tensors (got {type(loaded).__name__}); re-save the model with torch.export.save."
        )
    return loaded


def _deserialize(document: dict, state_dict: dict, constants: dict) -> Any:
    """torch's own deserializer on the checked parts (static fake tensors built directly: deserializer.py); no sample
    inputs (they are a pickle and nothing here needs them). torch raises many types for a program it cannot rebuild: the
    caller reads them as a malformed program (`_reading`). A torch lacking a part nothing replaces raises
    MissingDependencyError (torch_internals), which `_reading` passes on as it is."""
    from .program_schema import program_from_dict
    from .deserializer import deserialize

    return deserialize(program_from_dict(document), state_dict, constants)
