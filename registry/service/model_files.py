"""Giving a version back: its runnable model file in the source format, or its state dict as safetensors,
or the framework object.

The model file is rebuilt from the version's structure (registry/structure.py) with its tensors put back, by the
framework's model adapter (`ModelAdapter.write_model_file`), straight into the stream it goes to: a pulled file's
temporary sibling, fsynced and renamed when whole (schemas.atomic_io.atomic_writer), never built in memory first.
Every blob is re-hashed as it streams in from the store (a tampered one is refused, naming the version and the
tensor, and nothing is written), several at once and ahead of the writer (blob_fetch.py); the file is hashed as it
is written, and an ONNX file must hash to the digest recorded at registration. A safe reader accepted the structure
when the version was registered (structure_check.py, `structure_checked`), so the file is not read back; the file of
a version registered before that record existed is read back through the framework's safe reader (onnx protobuf and
checker, Keras safe_mode, the project's .pt2 reader) before anyone gets it.

The HTTP endpoint sends the file from an unnamed temporary file (`spooled_model_file`): its sha256 and length go in the
answer's headers, so the file is whole before the first byte leaves, and a request holds one chunk of it in memory
however slowly its client reads; the temporary file has no name, so nothing of it outlives the request or a killed
server.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from converters.adapters import REGISTRY
from converters.model_structure import sha256_of
from schemas.atomic_io import atomic_writer, writable
from schemas.errors import IntegrityError, NormbridgeError, OutputPathError, RegistryError

from ..manifest_io import tensors_from_blobs
from ..state_dict_file import state_dict_file, state_dict_names
from ..structure import structure_parts
from .blob_fetch import FetchedTensors
from .model_folders import FOLDER_FORMATS, folder_target, load_version_folder, write_version_folder

#: The file suffix `pull` writes per structure format (each framework's FrameworkInfo).
STRUCTURE_SUFFIXES: dict[str, str] = REGISTRY.structure_suffixes()
#: What `pull` writes: the source format of the version's structure (one file, or a folder), or its state dict.
PULL_FORMATS: tuple[str, ...] = ("source", *STRUCTURE_SUFFIXES, *FOLDER_FORMATS, "safetensors")
#: The suffix of each written format.
SUFFIXES: dict[str, str] = {**STRUCTURE_SUFFIXES, "safetensors": ".safetensors"}
#: progress(step, done, total), as registration reports it.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ModelFile:
    """A version as one file: its bytes, format, suffix and sha256 (what the HTTP endpoint sends in
    X-Normbridge-Digest)."""

    ref: str
    format: str
    data: bytes
    sha256: str | None = None  # computed as it was written, when it was

    @property
    def suffix(self) -> str:
        return SUFFIXES[self.format]

    @property
    def digest(self) -> str:
        return self.sha256 or sha256_of(self.data)


@dataclass(frozen=True)
class SpooledModelFile:
    """A version as one file in an unnamed temporary file (its space is freed when `chunks` ends or `close` is
    called)."""

    ref: str
    format: str
    handle: BinaryIO
    sha256: str
    nbytes: int

    @property
    def suffix(self) -> str:
        return SUFFIXES[self.format]

    def chunks(self, size: int = 1 << 20) -> Iterator[bytes]:
        """The file's bytes, `size` at a time; the file is closed at the end (or when the iterator is dropped)."""
        try:
            while chunk := self.handle.read(size):
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        self.handle.close()


@dataclass(frozen=True)
class PullResult:
    """What `pull` wrote."""

    ref: str
    path: str
    format: str
    digest: str
    nbytes: int


class HashingWriter:
    """A binary stream that hashes what it forwards to `stream`: a file's sha256 without a second pass over it."""

    def __init__(self, stream: BinaryIO):
        self.stream, self.sha, self.nbytes = stream, hashlib.sha256(), 0

    def write(self, data) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.stream.write(view)
        self.nbytes += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self.stream.flush()

    def hexdigest(self) -> str:
        return self.sha.hexdigest()


class ModelFiles:
    """The model-file half of `Registry` (registry/service/__init__.py)."""

    store: Any
    show: Callable[[str], Any]
    manifest: Callable[[str], Any]
    blob_reader: Callable[[Any], Callable[[str], bytes]]

    def model_file(self, ref: str, fmt: str | None = None, progress: Progress | None = None) -> ModelFile:
        """The version `ref` as one file in `fmt` ('source' or None: the format it was registered in; 'safetensors': its
        state dict).

        Raises:
            RegistryError: the format is unknown, or not the version's (a torch nn.Module has no structure: pull its
                state dict; converting to ONNX for serving is `export`).
            IntegrityError: a blob is tampered or missing, or the rebuilt file is not the one registered.
        """
        record, manifest, fmt = self._resolve_pull(ref, fmt)
        self._one_file(record.ref, fmt)
        return self._model_file(record, manifest, fmt, progress)

    def spooled_model_file(
        self, ref: str, fmt: str | None = None, progress: Progress | None = None
    ) -> SpooledModelFile:
        """`model_file` written to an unnamed temporary file instead of memory (what GET .../model streams); the caller
        closes it, or reads `chunks` to the end. Raises as `model_file` does, with nothing left behind."""
        record, manifest, fmt = self._resolve_pull(ref, fmt)
        self._one_file(record.ref, fmt)
        handle = tempfile.TemporaryFile(prefix="normbridge-model-")
        try:
            written = HashingWriter(handle)
            self._write_version(record, manifest, fmt, written, progress)
            if self._needs_read_back(
                record, fmt
            ):  # a version registered before its structure was checked: its reader takes bytes
                handle.seek(0)
                read_back(record.ref, fmt, manifest.framework, handle.read())
            handle.seek(0)
        except BaseException:
            handle.close()
            raise
        return SpooledModelFile(record.ref, fmt, handle, written.hexdigest(), written.nbytes)

    def _model_file(self, record, manifest, fmt: str, progress: Progress | None) -> ModelFile:
        buffer = io.BytesIO()
        written = HashingWriter(buffer)
        self._write_version(record, manifest, fmt, written, progress)
        data = buffer.getvalue()
        if self._needs_read_back(record, fmt):
            read_back(record.ref, fmt, manifest.framework, data)
        return ModelFile(record.ref, fmt, data, written.hexdigest())

    def pull(self, ref: str, path: str | Path, fmt: str | None = None, progress: Progress | None = None) -> PullResult:
        """Write the version to `path` atomically (see `model_file`); a directory gets '<name>-<N><suffix>' inside
        it."""
        record, manifest, fmt = self._resolve_pull(ref, fmt)
        if fmt in FOLDER_FORMATS:
            target = folder_target(path, record.ref)
            written = write_version_folder(
                manifest, self.blob_reader(record), self.store.parallel_transfers, target, progress
            )
            return PullResult(ref=record.ref, path=str(target), format=fmt, digest=manifest.digest(), nbytes=written)
        if self._needs_read_back(record, fmt):  # read back from memory before anything is written
            return write_pulled(self._model_file(record, manifest, fmt, progress), path, progress)
        target = pulled_path(path, record.ref, SUFFIXES[fmt])
        with atomic_writer(target) as stream:
            written = HashingWriter(stream)
            self._write_version(record, manifest, fmt, written, progress)
        if progress:
            progress("writing", written.nbytes, written.nbytes)
        return PullResult(
            ref=record.ref, path=str(target), format=fmt, digest=written.hexdigest(), nbytes=written.nbytes
        )

    def load(self, ref: str) -> Any:
        """The version as its framework's object (onnx.ModelProto, keras.Model, torch.export.ExportedProgram, or for a
        Hugging Face checkpoint folder the transformers model its config names, loaded by `from_pretrained`),
        read back safely.

        A torch nn.Module was stored as its state dict: build the module and call
        load_state_dict(registry.state_dict(ref)).
        """
        record, manifest, fmt = self._resolve_pull(ref, None)
        if fmt in FOLDER_FORMATS:
            return load_version_folder(manifest, self.blob_reader(record), self.store.parallel_transfers)
        file = self._model_file(record, manifest, fmt, None)
        return read_back(file.ref, file.format, manifest.framework, file.data)

    @staticmethod
    def _one_file(ref: str, fmt: str) -> None:
        """RegistryError when the version is given back as a folder, not as one file."""
        if fmt in FOLDER_FORMATS:
            raise RegistryError(
                f"version {ref} is {REGISTRY.info(FOLDER_FORMATS[fmt]).folder_formats[fmt]}, given back as a "
                f"folder, not one file: `normbridge pull {ref} -o DIR` writes it (or pull its tensors with "
                "--format safetensors)."
            )

    def state_dict(self, ref: str) -> dict:
        """The version's state dict as NumPy arrays by the model's own tensor names
        (what `--format safetensors` writes)."""
        record = self.show(ref)
        manifest = self.manifest(record.ref)
        get = self.blob_reader(record)
        tensors = tensors_from_blobs(manifest, get)
        return {name: tensors[name] for name in state_dict_names(manifest, structure_parts(manifest, get))}

    def _resolve_pull(self, ref: str, fmt: str | None):
        """(record, manifest, format written) of a pull of `ref` in `fmt`."""
        record = self.show(ref)
        manifest = self.manifest(record.ref)
        stored = manifest.structure.format if manifest.structure is not None else None
        return record, manifest, self._pull_format(record.ref, fmt or "source", stored)

    @staticmethod
    def _needs_read_back(record, fmt: str) -> bool:
        """A model file is read back unless a safe reader accepted its structure at registration
        (a state dict never is)."""
        return fmt != "safetensors" and not record.structure_checked

    def _write_version(self, record, manifest, fmt: str, stream: HashingWriter, progress: Progress | None) -> None:
        """Write the version in `fmt` to `stream`: the structure parts first, then each tensor as the writer reaches it,
        its blob read ahead and re-hashed (blob_fetch.FetchedTensors); an ONNX file must hash to the recorded digest."""
        report = progress or (lambda step, done, total: None)
        get = self.blob_reader(record)
        pool = ThreadPoolExecutor(max_workers=max(1, self.store.parallel_transfers))
        try:
            digests = sorted({ref.digest for ref in (manifest.structure.parts.values() if manifest.structure else ())})
            blobs = dict(zip(digests, pool.map(get, digests)))
            parts = structure_parts(manifest, blobs.__getitem__)
            if fmt == "safetensors":
                stream.write(
                    state_dict_file(
                        manifest, FetchedTensors(manifest, get, pool, state_dict_names(manifest, parts), report), parts
                    )
                )
                return
            adapter = REGISTRY.model_adapter(manifest.framework)
            tensors = FetchedTensors(manifest, get, pool, adapter.tensor_order(parts, manifest.tensors), report)
            adapter.write_model_file(parts, tensors, stream)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # after a refusal, blobs not yet read are not read
        expected = manifest.structure.file_digest
        if expected is not None and stream.hexdigest() != expected:
            raise IntegrityError(
                f"version {record.ref}: the rebuilt {fmt} file hashes to {stream.hexdigest()[:12]}, not the {expected[:12]} "
                "registered; it is not served: run `normbridge verify` on the version."
            )

    @staticmethod
    def _pull_format(ref: str, fmt: str, stored: str | None) -> str:
        if fmt not in PULL_FORMATS:
            raise RegistryError(f"format '{fmt}' is not one `pull` writes; use one of {', '.join(PULL_FORMATS)}.")
        if fmt == "safetensors":
            return fmt
        if stored is None:
            raise RegistryError(
                f"version {ref} holds no model structure (a torch nn.Module or a Keras model without a config registered "
                "from Python, or a version registered before normbridge stored structures), only its tensors; pull its "
                "state dict with --format safetensors."
            )
        if fmt not in ("source", stored):
            if stored in FOLDER_FORMATS:
                raise RegistryError(
                    f"version {ref} was registered as a folder ({stored}) and is given back as that folder or as "
                    f"safetensors, not {fmt}."
                )
            serve = f"; to serve it as ONNX run `normbridge export {ref} --to onnx -o FILE`" if fmt == "onnx" else ""
            raise RegistryError(
                f"version {ref} was registered as {stored} and is given back as {stored} or safetensors, not {fmt}{serve}."
            )
        return stored


def read_back(ref: str, fmt: str, framework: str, data: bytes) -> Any:
    """The framework's safe reader on a rebuilt model file: nobody gets a file normbridge itself would not load."""
    try:
        return REGISTRY.model_adapter(framework).load_bytes(data, f"{ref.replace('@', '-')}{STRUCTURE_SUFFIXES[fmt]}")
    except NormbridgeError as error:
        raise IntegrityError(
            f"version {ref}: the rebuilt {fmt} model does not load ({error}); run `normbridge verify` on it."
        ) from error


def pulled_path(path: str | Path, ref: str, suffix: str) -> Path:
    """`path`, or '<name>-<N><suffix>' inside it when it is a folder (an existing one, or a path ending in '/', made if
    missing); refused (OutputPathError) before anything is read when it cannot be written or names another format than
    the one written (a .pt2 archive saved as 'model.onnx')."""
    target, name = Path(path), f"{ref.replace('@', '-')}{suffix}"
    if target.is_dir() or str(path).endswith(("/", os.sep)):
        return writable(writable(target, folder=True) / name)
    if target.suffix.lower() != suffix:
        what = f"ends in '{target.suffix}'" if target.suffix else "has no file extension"
        raise OutputPathError(
            f"'{target}' {what}, but {ref} is written as a {suffix} file; pass a path ending in {suffix}, or a "
            f"folder (an existing one, or a path ending in '/') to write {name} into."
        )
    return writable(target)


def write_pulled(file: ModelFile, path: str | Path, progress: Progress | None = None) -> PullResult:
    """Write `file` to `path` atomically; a directory gets '<name>-<N><suffix>' inside it."""
    target = pulled_path(path, file.ref, file.suffix)
    if progress:
        progress("writing", 0, len(file.data))
    with atomic_writer(target) as stream:
        stream.write(file.data)
    if progress:
        progress("writing", len(file.data), len(file.data))
    return PullResult(ref=file.ref, path=str(target), format=file.format, digest=file.digest, nbytes=len(file.data))


__all__ = [
    "HashingWriter",
    "ModelFile",
    "ModelFiles",
    "PULL_FORMATS",
    "PullResult",
    "SpooledModelFile",
    "pulled_path",
    "read_back",
    "write_pulled",
]
