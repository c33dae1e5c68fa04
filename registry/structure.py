"""A model's structure in the blob store: each part (a file of the model's format without tensor bytes) as a uint8
tensor blob.

Parts are single-tensor safetensors blobs like every tensor (registry/tensor_blobs.py), so the store, the bundle
upload, gc and verify treat them the same way and identical structure is stored once: a fine-tune that moved only
the statistics adds no structure blob at all. Reading a part back re-hashes it (the store) and checks it against
its manifest entry, then hands the bytes to the framework's own safe reader.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from schemas.manifest import ArtifactManifest, ModelStructure, TensorRef, sha256_hex

from .tensor_blobs import tensor_blob, tensor_from_blob


def structure_record(parts, blobs: dict[str, bytes]) -> ModelStructure | None:
    """The manifest's record of `parts` (converters.model_structure.StructureParts or None);
    each part's blob goes into `blobs`."""
    if parts is None:
        return None
    refs = {}
    for name, data in sorted(parts.parts.items()):
        blob = tensor_blob(np.frombuffer(data, dtype=np.uint8))
        digest = sha256_hex(blob)
        blobs[digest] = blob
        refs[name] = TensorRef(digest=digest, dtype="uint8", shape=[len(data)], nbytes=len(data), role="weight")
    return ModelStructure(format=parts.format, parts=refs, file_digest=parts.file_digest)


def structure_parts(manifest: ArtifactManifest, get: Callable[[str], bytes]) -> dict[str, bytes]:
    """Every structure part's bytes, read through `get(digest)` and checked against its manifest entry."""
    if manifest.structure is None:
        return {}
    return {
        name: tensor_from_blob(get(ref.digest), ref, f"structure part '{name}'").tobytes()
        for name, ref in manifest.structure.parts.items()
    }


__all__ = ["structure_parts", "structure_record"]
