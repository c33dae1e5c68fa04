"""Giving a version back: its runnable model file in the source format, or its state dict as safetensors, or the framework object.

The model file is rebuilt from the version's structure (registry/structure.py) with its tensors put back, by the
framework's model adapter (`ModelAdapter.model_file`); every blob is re-hashed on the way out (a tampered one is
refused, naming the version and the tensor), an ONNX file must hash to the digest recorded at registration, and the
result is read back through the framework's safe reader (onnx protobuf and checker, Keras safe_mode, the project's
.pt2 reader) before anyone gets it. Files are written atomically.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters.adapters import REGISTRY
from converters.model_structure import STRUCTURE_SUFFIXES, sha256_of
from schemas.atomic_io import atomic_write_bytes
from schemas.errors import IntegrityError, NormbridgeError, RegistryError

from ..manifest_io import tensors_from_blobs
from ..state_dict_file import state_dict_file, state_dict_names
from ..structure import structure_parts
from ..tensor_blobs import tensor_view

#: What `pull` writes: the source format of the version's structure, or its state dict.
PULL_FORMATS: tuple[str, ...] = ("source", *STRUCTURE_SUFFIXES, "safetensors")
#: The suffix of each written format.
SUFFIXES: dict[str, str] = {**STRUCTURE_SUFFIXES, "safetensors": ".safetensors"}
#: progress(step, done, total), as registration reports it.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ModelFile:
    """A version as one file: its bytes, format, suffix and sha256 (what the HTTP endpoint sends in X-Normbridge-Digest)."""

    ref: str
    format: str
    data: bytes

    @property
    def suffix(self) -> str:
        return SUFFIXES[self.format]

    @property
    def digest(self) -> str:
        return sha256_of(self.data)


@dataclass(frozen=True)
class PullResult:
    """What `pull` wrote."""

    ref: str
    path: str
    format: str
    digest: str
    nbytes: int


class ModelFiles:
    """The model-file half of `Registry` (registry/service/__init__.py)."""

    store: Any
    show: Callable[[str], Any]
    manifest: Callable[[str], Any]
    blob_reader: Callable[[Any], Callable[[str], bytes]]

    def model_file(self, ref: str, fmt: str | None = None, progress: Progress | None = None) -> ModelFile:
        """The version `ref` as one file in `fmt` ('source' or None: the format it was registered in; 'safetensors': its state dict).

        Raises:
            RegistryError: the format is unknown, or not the version's (a torch nn.Module has no structure: pull its state dict;
                converting to ONNX for serving is `export`).
            IntegrityError: a blob is tampered or missing, or the rebuilt file is not the one registered.
        """
        report = progress or (lambda step, done, total: None)
        record = self.show(ref)
        manifest = self.manifest(record.ref)
        stored = manifest.structure.format if manifest.structure is not None else None
        fmt = self._pull_format(record.ref, fmt or "source", stored)
        blobs = self._read_blobs(record, manifest.blob_digests(), report)
        tensors = {name: tensor_view(blobs[ref.digest], ref, name) for name, ref in manifest.tensors.items()}
        parts = structure_parts(manifest, blobs.__getitem__)
        if fmt == "safetensors":
            return ModelFile(record.ref, fmt, state_dict_file(manifest, tensors, parts))
        report(f"rebuilding the {fmt} model", 0, 1)
        data = REGISTRY.model_adapter(manifest.framework).model_file(parts, tensors)
        expected = manifest.structure.file_digest
        if expected is not None and sha256_of(data) != expected:
            raise IntegrityError(f"version {record.ref}: the rebuilt {fmt} file hashes to {sha256_of(data)[:12]}, not the {expected[:12]} registered; "
                                 "it is not served: run `normbridge verify` on the version.")
        read_back(record.ref, fmt, manifest.framework, data)
        report(f"rebuilding the {fmt} model", 1, 1)
        return ModelFile(record.ref, fmt, data)

    def pull(self, ref: str, path: str | Path, fmt: str | None = None, progress: Progress | None = None) -> PullResult:
        """Write the version to `path` atomically (see `model_file`); a directory gets '<name>-<N><suffix>' inside it."""
        return write_pulled(self.model_file(ref, fmt, progress), path, progress)

    def load(self, ref: str) -> Any:
        """The version as its framework's object (onnx.ModelProto, keras.Model, torch.export.ExportedProgram), read back safely.

        A torch nn.Module was stored as its state dict: build the module and call load_state_dict(registry.state_dict(ref)).
        """
        file = self.model_file(ref)
        return read_back(file.ref, file.format, self.manifest(file.ref).framework, file.data)

    def state_dict(self, ref: str) -> dict:
        """The version's state dict as NumPy arrays by the model's own tensor names (what `--format safetensors` writes)."""
        record = self.show(ref)
        manifest = self.manifest(record.ref)
        get = self.blob_reader(record)
        tensors = tensors_from_blobs(manifest, get)
        return {name: tensors[name] for name in state_dict_names(manifest, structure_parts(manifest, get))}

    def _read_blobs(self, record, digests: list[str], report: Progress) -> dict[str, bytes]:
        """Every blob of the version, re-hashed (blob_reader), several at once where the store gains from it (S3)."""
        get = self.blob_reader(record)
        blobs: dict[str, bytes] = {}
        with ThreadPoolExecutor(max_workers=max(1, self.store.parallel_transfers)) as pool:
            for i, (digest, data) in enumerate(zip(digests, pool.map(get, digests))):
                report("reading blobs", i, len(digests))
                blobs[digest] = data
        report("reading blobs", len(digests), len(digests))
        return blobs

    @staticmethod
    def _pull_format(ref: str, fmt: str, stored: str | None) -> str:
        if fmt not in PULL_FORMATS:
            raise RegistryError(f"format '{fmt}' is not one `pull` writes; use one of {', '.join(PULL_FORMATS)}.")
        if fmt == "safetensors":
            return fmt
        if stored is None:
            raise RegistryError(f"version {ref} holds no model structure (a torch nn.Module or a Keras model without a config registered "
                                "from Python, or a version registered before normbridge stored structures), only its tensors; pull its "
                                "state dict with --format safetensors.")
        if fmt not in ("source", stored):
            raise RegistryError(f"version {ref} was registered as {stored} and is given back as {stored} or safetensors, not {fmt}; "
                                f"to serve it as ONNX run `normbridge export {ref} --to onnx -o FILE`.")
        return stored


def read_back(ref: str, fmt: str, framework: str, data: bytes) -> Any:
    """The framework's safe reader on a rebuilt model file: nobody gets a file normbridge itself would not load."""
    try:
        return REGISTRY.model_adapter(framework).load_bytes(data, f"{ref.replace('@', '-')}{STRUCTURE_SUFFIXES[fmt]}")
    except NormbridgeError as error:
        raise IntegrityError(f"version {ref}: the rebuilt {fmt} model does not load ({error}); run `normbridge verify` on it.") from error


def write_pulled(file: ModelFile, path: str | Path, progress: Progress | None = None) -> PullResult:
    """Write `file` to `path` atomically; a directory gets '<name>-<N><suffix>' inside it."""
    target = Path(path)
    if target.is_dir():
        target = target / f"{file.ref.replace('@', '-')}{file.suffix}"
    if progress:
        progress("writing", 0, len(file.data))
    atomic_write_bytes(target, file.data)
    if progress:
        progress("writing", len(file.data), len(file.data))
    return PullResult(ref=file.ref, path=str(target), format=file.format, digest=file.digest, nbytes=len(file.data))


__all__ = ["ModelFile", "ModelFiles", "PULL_FORMATS", "PullResult", "read_back", "write_pulled"]
