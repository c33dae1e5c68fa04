"""The artifact manifest: one model version's normalization state and the digests of its tensors.

The manifest is JSON, schema-validated, and says everything but the tensor bytes: the model's
framework, format and mode, every tensor by name (digest, dtype, shape, role), every normalizer
with its `NormSpec` configuration and which manifest tensor holds each of its spec tensors, the
lineage and the equivalence report. Two digests: `content_digest()` covers what the model
computes (framework, format, mode, tensors, normalizers), so registering identical content twice
is recognised; `digest()` covers the whole document and names the artifact.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer

from .errors import InputFileError, SpecError
from .tensors import check_tensor_record

MANIFEST_SCHEMA_VERSION = 1

Role = Literal["weight", "scale", "bias", "running_mean", "running_var", "num_batches_tracked"]
Operation = Literal["registered", "fine-tuned", "recalibrated", "converted", "imported"]
ArtifactFormat = Literal["torch-module", "pt2", "keras", "onnx", "artifact"]
Mode = Literal["train", "eval", "mixed", "n/a"]

#: Roles that hold running statistics (state moved by forward passes in train mode, not by an optimizer).
STATISTIC_ROLES: frozenset[str] = frozenset({"running_mean", "running_var", "num_batches_tracked"})
#: Roles an optimizer moves.
WEIGHT_ROLES: frozenset[str] = frozenset({"weight", "scale", "bias"})
#: How `blob_refs` names a structure part's blob beside the tensors.
STRUCTURE_PREFIX = "structure:"


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII: the same document always gives the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class TensorRef(BaseModel):
    """One tensor of the model: its blob's digest and what it is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    digest: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the tensor's single-tensor safetensors blob.")
    dtype: str = Field(description="NumPy dtype name, e.g. float32.")
    shape: list[int] = Field(description="Shape ([] for a scalar).")
    nbytes: int = Field(ge=0, description="Bytes of the raw tensor data.")
    role: Role = Field(
        description="weight for every tensor that is not normalizer state; else the spec tensor it holds."
    )
    layer: str | None = Field(default=None, description="Normalizer path (for normalizer state) or owning layer.")


class NormalizerEntry(BaseModel):
    """One normalization layer: its spec configuration and where its spec tensors are."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(min_length=1, description="Module path, Keras layer name or ONNX node name.")
    spec: dict = Field(description="NormSpec.config_dict(): every field but the tensors.")
    tensors: dict[str, str] = Field(default_factory=dict, description="Spec tensor name -> manifest tensor name.")


class Lineage(BaseModel):
    """Where the version came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    parent: str | None = Field(default=None, description="'name@N' of the parent version.")
    operation: Operation = Field(default="registered")


class UnrecognisedLayer(BaseModel):
    """A layer that looks like a normalization and that no recognizer proved: registered unchecked, by request only."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(min_length=1, description="Module path, Keras layer name or ONNX node name.")
    type: str = Field(description="The layer's class (or op type), as the framework names it.")
    reason: str = Field(description="Why it looks like a normalization and why it was not proved.")


StructureFormat = Literal["onnx", "keras", "pt2", "hf-folder"]


class ModelStructure(BaseModel):
    """What the model computes besides its tensors, so a version can be given back runnable (registry/structure.py).

    Each part is a file of the model's own format with the tensor bytes left out (an ONNX graph whose initializers
    hold no data, a .keras config, a .pt2 program's JSON): stored as a blob like a tensor (a uint8 tensor of the
    part's bytes), so identical structure is stored once. Never a pickle, never code.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: StructureFormat = Field(
        description="The format `pull` writes: onnx, keras or pt2 (one file), or hf-folder (a Hugging Face checkpoint folder)."
    )
    parts: dict[str, TensorRef] = Field(
        description="Part name (a file of the format) -> its blob, a uint8 tensor of its bytes."
    )
    file_digest: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the file `pull` writes, when it is byte-identical to what was registered.",
    )


#: The fields of a manifest that say what the model computes: its content digest covers these and nothing else.
CONTENT_FIELDS = ("framework", "format", "mode", "tensors", "normalizers", "structure")
#: Provenance inside a normalizer's spec that says which reader read the file, not what the file computes: the same
#: bytes read under torch 2.13 and 2.14 are the same content (kept in the manifest, left out of the content digest).
READER_FIELDS = ("framework_version",)


def content_document(document: dict) -> dict:
    """The part of a manifest document (model_dump(mode="json")) that the content digest covers.

    CONTENT_FIELDS, with each normalizer's `spec.source` stripped of READER_FIELDS: the version of the framework that
    read the file is provenance, so a registry keeps recognising identical bytes across framework upgrades.
    """
    content = {name: document[name] for name in CONTENT_FIELDS if name in document}
    if "normalizers" in content:
        content["normalizers"] = [_without_reader(entry) for entry in content["normalizers"]]
    return content


def _without_reader(entry: dict) -> dict:
    source = entry.get("spec", {}).get("source")
    if not isinstance(source, dict) or not any(name in source for name in READER_FIELDS):
        return entry
    source = {name: value for name, value in source.items() if name not in READER_FIELDS}
    return {**entry, "spec": {**entry["spec"], "source": source}}


def _digest_of(document: dict) -> str:
    return sha256_hex(canonical_json(document).encode())


class ArtifactManifest(BaseModel):
    """A model version without its tensor bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = Field(default=MANIFEST_SCHEMA_VERSION)
    framework: Literal["torch", "keras", "onnx"]
    format: ArtifactFormat
    mode: Mode
    tensors: dict[str, TensorRef]
    normalizers: list[NormalizerEntry]
    lineage: Lineage = Field(default_factory=Lineage)
    equivalence: list[dict] = Field(default_factory=list, description="CheckResult JSON per normalizer.")
    note: str | None = None
    unrecognised: list[UnrecognisedLayer] = Field(
        default_factory=list,
        description="Layers that look like normalizations and that no recognizer proved; a registration holds them only when "
        "--allow-unrecognised was given, and they are left out of the document when there are none.",
    )
    structure: ModelStructure | None = Field(
        default=None,
        description="The model's structure (graph, config or program) beside its tensors, so `pull` can give the version back runnable; "
        "left out of the document when there is none (a torch nn.Module is stored as its state dict).",
    )

    @model_serializer(mode="wrap")
    def _omit_empty_unrecognised(self, handler):
        """Manifests without unrecognised layers or structure serialise (and so digest) exactly as before the fields
        existed."""
        document = handler(self)
        for name in ("unrecognised", "structure"):
            if name in document and not document[name]:
                document.pop(name)
        return document

    def content_digest(self) -> str:
        """sha256 of what the model computes (its structure too, when stored); lineage, equivalence report, note and the
        reading framework's version are left out (content_document)."""
        return _digest_of(content_document(self.model_dump(mode="json", include=set(CONTENT_FIELDS))))

    def digest(self) -> str:
        """sha256 of the whole manifest: the artifact digest."""
        return _digest_of(self.model_dump(mode="json"))

    def digests_and_document(self) -> tuple[str, str, dict]:
        """(digest(), content_digest(), model_dump(mode="json")) from one dump: a registration stores all three, and
        each dump of a 160-normalizer manifest with its equivalence report costs milliseconds."""
        document = self.model_dump(mode="json")
        return _digest_of(document), _digest_of(content_document(document)), document

    def to_canonical_json(self) -> str:
        return canonical_json(self.model_dump(mode="json"))

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=indent, sort_keys=True)

    def blob_refs(self) -> dict[str, TensorRef]:
        """Every blob the manifest references by name: the tensors, then each structure part as 'structure:<part>'."""
        refs = dict(self.tensors)
        if self.structure is not None:
            refs.update({f"{STRUCTURE_PREFIX}{part}": ref for part, ref in self.structure.parts.items()})
        return refs

    def blob_digests(self) -> list[str]:
        """Every distinct blob digest the manifest references (tensors and structure parts), sorted."""
        return sorted({ref.digest for ref in self.blob_refs().values()})


def upgrade_manifest(document: dict) -> dict:
    """Bring a manifest document of any known schema version to the current one."""
    version = document.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= MANIFEST_SCHEMA_VERSION:
        raise SpecError(
            f"unknown manifest schema_version {version!r}; this normbridge reads versions 1 to {MANIFEST_SCHEMA_VERSION}."
        )
    # Version 1 is current; each future version adds one step here.
    return dict(document)


def load_manifest(document: dict) -> ArtifactManifest:
    """A validated manifest from its JSON document; SpecError/InputFileError naming what is wrong.

    Every tensor's dtype, shape and byte length must agree (tensors.check_tensor_record), whatever reads the manifest:
    an upload, a folder, or a version the registry stored.
    """
    if not isinstance(document, dict):
        raise InputFileError(
            f"a manifest must be a JSON object, got {type(document).__name__}; pass the manifest.json of a saved artifact."
        )
    document = upgrade_manifest(document)
    try:
        manifest = ArtifactManifest.model_validate(document)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()[:5])
        raise SpecError(f"the manifest does not match the schema ({problems}); re-extract the artifact.") from error
    for name, ref in manifest.blob_refs().items():
        check_tensor_record(name, ref.dtype, ref.shape, ref.nbytes)
    if manifest.structure is not None:
        for part, ref in manifest.structure.parts.items():
            if (
                ref.dtype != "uint8"
                or len(ref.shape) != 1
                or not part
                or ".." in part.split("/")
                or part.startswith("/")
            ):
                raise SpecError(
                    f"structure part '{part}' is {ref.dtype}{ref.shape}; a part is a plain relative name holding a 1-d uint8 "
                    "tensor of its bytes; re-extract the artifact."
                )
    for entry in manifest.normalizers:
        for spec_name, tensor_name in entry.tensors.items():
            if tensor_name not in manifest.tensors:
                raise SpecError(
                    f"spec tensor '{spec_name}' points to tensor '{tensor_name}', which the manifest does not list; re-extract the artifact.",
                    layer=entry.path,
                )
    return manifest
