"""Extracting an artifact from a model: its manifest, one blob per tensor, and its normalizer specs.

Every tensor of the model (torch state_dict keys, Keras variable paths, ONNX initializer names)
becomes its own blob: a single-tensor safetensors file with the key "tensor". The bytes depend
only on the tensor, so equal tensors share one blob across versions and models, and a fine-tune
that moved only the running statistics adds only the statistics' blobs. Each normalizer's spec
tensors point to the model tensor that holds the same bytes; a spec tensor the model does not
hold (Keras and ONNX keep no num_batches_tracked) is stored as an extra tensor '<path>::<name>'.
What a model holds is read by its framework's model adapter (converters.models.artifact); the
manifest, blobs and folders are registry/manifest_io.py.

No tensor is copied and no blob of a model file is held whole: each blob is hashed a chunk at a time
here and streamed into the store again when staged (registry/streamed_blobs.py), from the file where
the model's reader left the bytes (a `.pt2`'s large payloads are mapped, not read). Only a caller's
live model object has its blobs' bytes kept, as a snapshot of what was checked.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from converters.model_contents import ModelContents
from converters.models.artifact import model_contents
from schemas import NormSpec
from schemas.errors import InputFileError
from schemas.manifest import ArtifactManifest, Lineage, NormalizerEntry, TensorRef, UnrecognisedLayer
from schemas.tensors import STORED_DTYPES, tensors_identical

from .manifest_io import MANIFEST_FILE, Artifact, load_artifact_folder
from .recognition_gate import EXPLAINS_NONE, nothing_found, unrecognised_layers
from .structure import structure_record
from .streamed_blobs import BlobMap, TensorBlob


class _Builder:
    """Collects tensors and normalizers into a manifest and its blobs."""

    def __init__(self, framework: str, fmt: str):
        self.framework, self.format = framework, fmt
        self.arrays: dict[str, np.ndarray] = {}
        self.sources: dict[
            str, object
        ] = {}  # name -> where the tensor's bytes can be streamed from (converters.tensor_bytes)
        self.private = False  # the model was read from a file for this artifact alone (ModelContents.private)
        self.layers: dict[str, str | None] = {}
        self.roles: dict[str, str] = {}
        self.entries: list[NormalizerEntry] = []
        self.specs: list[NormSpec] = []
        self.sites = 0  # normalization layers found in the model (each must become an entry)
        self.unrecognised: list[
            UnrecognisedLayer
        ] = []  # layers that look like normalizations and that no recognizer proved
        self.structure = None  # converters.model_structure.StructureParts, stored as one uint8 blob per part

    def add_tensor(self, name: str, array: np.ndarray, layer: str | None = None, source: object = None) -> None:
        """Keep the tensor as the model holds it, uncopied (a large one may be mapped from the model file, and streamed
        into its blob from `source` when given); `build` hashes its blob, and keeps the blob's bytes only for a caller's
        live model, which may change afterwards (a model read from a file for this artifact alone is streamed again when
        staged)."""
        if str(array.dtype) not in STORED_DTYPES:
            raise InputFileError(
                f"tensor '{name}' has dtype {array.dtype}, which an artifact cannot store; "
                f"convert it to one of {', '.join(STORED_DTYPES)}."
            )
        self.arrays[name] = array
        self.sources.pop(name, None)
        if source is not None:
            self.sources[name] = source
        self.layers[name] = layer

    def add_normalizer(self, path: str, spec: NormSpec, candidates: dict[str, str]) -> None:
        """Point each spec tensor to the candidate tensor (spec name -> model tensor name) holding its bytes."""
        mapping: dict[str, str] = {}
        for spec_name, array in sorted(spec.tensors.items()):
            target = candidates.get(spec_name)
            if (
                target is None
                or target not in self.arrays
                or not tensors_identical(self.arrays[target], array)
                or target in self.roles
            ):
                target = f"{path}::{spec_name}"
            # The checked spec's own copy is what is stored: a live model changing under the registration cannot make
            # the blob differ from what the gate checks.
            self.add_tensor(target, np.array(array, order="C", copy=True))
            self.roles[target] = spec_name
            self.layers[target] = path
            mapping[spec_name] = target
        self.entries.append(NormalizerEntry(path=path, spec=spec.config_dict(), tensors=mapping))
        self.specs.append(spec)

    def add(self, contents: ModelContents) -> None:
        """Every tensor of the model, then each normalizer pointed at the tensors holding its bytes."""
        self.sites = contents.sites
        self.private = contents.private
        self.unrecognised = unrecognised_layers(contents.hazards)
        self.structure = contents.structure
        for tensor in contents.tensors:
            self.add_tensor(tensor.name, tensor.array, layer=tensor.layer, source=tensor.source)
        for normalizer in contents.normalizers:
            self.add_normalizer(normalizer.path, normalizer.spec, normalizer.candidates)
        if (
            not self.entries
            and self.arrays
            and not self.unrecognised
            and any(h.code in EXPLAINS_NONE for h in contents.hazards)
        ):
            self.unrecognised = [
                nothing_found(self.framework, len(self.arrays), contents.hazards)
            ]  # the refusal says why

    def build(self, mode: str, lineage: Lineage | None, known: Callable[[TensorBlob], str | None] | None) -> Artifact:
        """Every blob hashed a chunk at a time (registry/streamed_blobs.py): none is held whole. `known(blob)`: its
        digest when it was hashed already (registry/early_staging.py); asked for no tensor a normalizer's spec points
        to, which is hashed here, after the spec was read, as the gate checks it."""
        blobs = BlobMap()
        refs: dict[str, TensorRef] = {}
        for name in sorted(self.arrays):
            array = self.arrays[name]
            blob = TensorBlob(array, self.sources.get(name), snapshot=not self.private)
            if known is not None and name not in self.roles:
                blob.digest = known(blob)
            digest = blobs.add(blob)
            refs[name] = TensorRef(
                digest=digest,
                dtype=str(array.dtype),
                shape=list(array.shape),
                nbytes=int(array.nbytes),
                role=self.roles.get(name, "weight"),
                layer=self.layers.get(name),
            )
        manifest = ArtifactManifest(
            framework=self.framework,
            format=self.format,
            mode=mode,
            tensors=refs,
            normalizers=self.entries,
            lineage=lineage or Lineage(),
            unrecognised=self.unrecognised,
            structure=structure_record(self.structure, blobs),
        )
        return Artifact(
            manifest=manifest,
            blobs=blobs,
            specs=self.specs,
            sites=self.sites,
            structure_read_safely=self.structure is not None and self.structure.read_safely,
        )


def _mode_of(specs: list[NormSpec]) -> str:
    if not specs:
        return "n/a"
    flags = {spec.training for spec in specs}
    return "mixed" if len(flags) == 2 else ("train" if flags == {True} else "eval")


def extract_artifact(
    model: Any, lineage: Lineage | None = None, known: Callable[[TensorBlob], str | None] | None = None
) -> Artifact:
    """The artifact of a torch nn.Module, ExportedProgram, keras.Model, onnx.ModelProto, or a path.

    Paths: .pt2, .keras (safe_mode), .onnx through converters.models.loading.load_model, or a
    saved artifact folder (its content is kept; its lineage becomes `lineage`, by default 'imported').
    Refused before anything is produced: pickles, unreadable files, invalid specs (NaN statistics
    name their layer). `known`: see `_Builder.build`.
    """
    if isinstance(model, (str, Path)):
        path = Path(model)
        if path.is_dir() and (path / MANIFEST_FILE).exists():
            artifact = load_artifact_folder(path)
            artifact.manifest = artifact.manifest.model_copy(
                update={"lineage": lineage or Lineage(operation="imported")}
            )
            return artifact
    contents = model_contents(model)
    builder = _Builder(contents.framework, contents.format)
    builder.add(contents)
    return builder.build(contents.mode or _mode_of(builder.specs), lineage, known)


__all__ = ["extract_artifact"]
