"""Artifacts as stored: a manifest, one blob per tensor, the specs rebuilt from both, and artifact folders on disk.

Every tensor is its own blob, a single-tensor safetensors file (registry/tensor_blobs.py), so equal
tensors share one blob across versions and models. Reading always goes through the manifest:
each blob must be the tensor the manifest says, and each spec is re-validated (NaN statistics are
refused, naming the layer). Extraction from a model object is registry/artifact.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from schemas import NormSpec
from schemas.atomic_io import atomic_write_folder
from schemas.errors import InputFileError, SpecError
from schemas.layer_errors import layer_error
from schemas.manifest import ArtifactManifest, load_manifest, sha256_hex

from .streamed_blobs import BlobMap
from .tensor_blobs import tensor_from_blob

MANIFEST_FILE = "manifest.json"
BLOBS_DIR = "blobs"
#: The last member of a bundle download the server had to stop (a stored blob failed its hash): why, as error JSON.
BUNDLE_ERROR_FILE = "normbridge-error.json"


@dataclass
class Artifact:
    """A manifest, the blobs it references (digest -> bytes; an extracted model's are a streamed_blobs.BlobMap, which
    reads each tensor's blob only when asked, and a chunk at a time through `chunks`) and the normalizer specs.

    `sites` is how many normalization layers the model holds, as its reader found them (None for a saved artifact
    folder, whose manifest is all there is): the registry's gate refuses a registration that checks fewer.
    `structure_read_safely`: the manifest's structure is what the framework's safe reader accepted when it loaded the
    registered file (converters.model_structure.StructureParts.read_safely); otherwise registration checks it.
    """

    manifest: ArtifactManifest
    blobs: MutableMapping[str, bytes] = field(default_factory=dict)
    specs: list[NormSpec] = field(default_factory=list)
    sites: int | None = None
    structure_read_safely: bool = False


# -- reading blobs ----------------------------------------------------------------------------


def tensors_from_blobs(manifest: ArtifactManifest, get: Callable[[str], bytes]) -> dict[str, np.ndarray]:
    """Every manifest tensor by name, read through `get(digest)`."""
    return {name: tensor_from_blob(get(ref.digest), ref, name) for name, ref in manifest.tensors.items()}


def specs_from_manifest(manifest: ArtifactManifest, get: Callable[[str], bytes]) -> list[NormSpec]:
    """Every normalizer's NormSpec rebuilt from its configuration and blobs (validated: NaN statistics are refused)."""
    specs = []
    for entry in manifest.normalizers:
        tensors = {}
        for spec_name, tensor_name in entry.tensors.items():
            ref = manifest.tensors[tensor_name]
            tensors[spec_name] = tensor_from_blob(get(ref.digest), ref, tensor_name)
        specs.append(_spec(entry.path, entry.spec, tensors))
    return specs


def _spec(path: str, config: dict, tensors: dict[str, np.ndarray]) -> NormSpec:
    try:
        return NormSpec(**config, tensors=tensors)
    except SpecError as error:
        raise layer_error(error, path) from error
    except Exception as error:  # pydantic ValidationError
        raise SpecError(f"the normalizer's spec does not match the schema ({error}).", layer=path) from error


# -- folders ----------------------------------------------------------------------------------


def blob_chunks(blobs: MutableMapping[str, bytes], digest: str) -> Iterator[bytes]:
    """The bytes of blob `digest` a chunk at a time where `blobs` streams them (streamed_blobs.BlobMap),
    else at once."""
    if isinstance(blobs, BlobMap):
        yield from blobs.chunks(digest)
    else:
        yield blobs[digest]


def save_artifact_folder(artifact: Artifact, folder: str | Path) -> Path:
    """Write manifest.json and blobs/<digest>.safetensors into `folder`, atomically."""

    def fill(target: Path) -> None:
        (target / BLOBS_DIR).mkdir(parents=True, exist_ok=True)
        for digest in artifact.manifest.blob_digests():
            with open(target / BLOBS_DIR / f"{digest}.safetensors", "wb") as stream:
                for chunk in blob_chunks(artifact.blobs, digest):
                    stream.write(chunk)
        (target / MANIFEST_FILE).write_text(artifact.manifest.to_json() + "\n")

    return atomic_write_folder(folder, fill)


def load_artifact_folder(folder: str | Path) -> Artifact:
    """The artifact saved in `folder`; every blob is re-hashed and every spec re-validated first."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        raise InputFileError(f"'{folder}' holds no {MANIFEST_FILE}; pass a folder written by save_artifact_folder.")
    try:
        document = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputFileError(f"'{manifest_path}' is not valid JSON ({error}); re-export the artifact.") from error
    manifest = load_manifest(document)
    blobs: dict[str, bytes] = {}
    for digest in manifest.blob_digests():
        path = folder / BLOBS_DIR / f"{digest}.safetensors"
        if not path.is_file():
            raise InputFileError(
                f"blob '{path.name}' listed in the manifest is missing from '{folder / BLOBS_DIR}'; re-export the artifact."
            )
        data = path.read_bytes()
        if sha256_hex(data) != digest:
            raise InputFileError(
                f"blob '{path}' does not hash to its name (sha256 {sha256_hex(data)[:12]}...): it was corrupted or modified; re-export the artifact."
            )
        blobs[digest] = data
    tensors_from_blobs(manifest, blobs.__getitem__)  # every blob must be the tensor the manifest says
    specs = specs_from_manifest(manifest, blobs.__getitem__)
    return Artifact(manifest=manifest, blobs=blobs, specs=specs)


__all__ = [
    "Artifact",
    "BLOBS_DIR",
    "BUNDLE_ERROR_FILE",
    "MANIFEST_FILE",
    "load_artifact_folder",
    "save_artifact_folder",
    "specs_from_manifest",
    "tensors_from_blobs",
]
