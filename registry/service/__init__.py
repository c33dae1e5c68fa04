"""The registry as one object: the CLI and the HTTP API call only this.

`Registry` composes the blob store (bytes, content-addressed), the metadata store (versions,
lineage, aliases, audit log, all in SQL) and the artifact code (manifests, diffs, lineage
views). Registering is `registration.py` here (the crash-safe order: stage while the gate runs,
publish, one commit), verifying and garbage collection `integrity.py`, what they return
`results.py`, each layer of a version as a file `layer_export.py`, the servable verdict and the
guard on aliases `servable.py`; this module holds the reads, aliases and the export.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from converters.gate import ChildWorkerGate, Gate
from schemas.errors import (
    IntegrityError,
    InvalidReferenceError,
    NormbridgeError,
    NotFoundError,
    NotServableError,
    RegistryError,
)
from schemas.manifest import load_manifest

from .. import settings
from ..blob_leases import BlobLeases
from ..blobs import open_blob_store
from ..diff import diff_manifests
from ..lineage import build_lineage
from ..manifest_io import specs_from_manifest, tensors_from_blobs
from ..metadata import MetadataStore
from .integrity import Integrity
from .interface import ModelRegistry
from .layer_export import export_layers
from .model_files import ModelFiles
from .registration import NAME, Registrations
from .results import RegistryExport
from .servable import assess, guard_alias, unassessable


class Registry(Registrations, Integrity, ModelFiles, ModelRegistry):
    """A model registry on a metadata database and a blob store; zero configuration by default.

    Args:
        db: SQLAlchemy URL; default $NORMBRIDGE_DB, else SQLite under $NORMBRIDGE_HOME (~/.local/share/normbridge).
        blobs: blob store URI ('file:///abs/path' or a path); default $NORMBRIDGE_BLOBS, else `blobs/` there.
        user: recorded in the audit log; default $NORMBRIDGE_USER, else the login name.
        guarded_aliases: aliases only a servable version may take unless forced; default $NORMBRIDGE_GUARDED_ALIASES,
            else production (settings.guarded_aliases).
        gate: where the equivalence gate's checks run (converters.gate); default a `ChildWorkerGate`: the frameworks
            this process has not imported are checked in a child process (the CLI passes the shared worker's gate).
    """

    def __init__(
        self,
        db: str | None = None,
        blobs: str | None = None,
        user: str | None = None,
        guarded_aliases: Iterable[str] | None = None,
        gate: Gate | None = None,
    ):
        self.db_url = settings.database_url(db)
        self.blob_uri = settings.blobs_uri(blobs)
        self.user = settings.current_user(user)
        self.guarded_aliases = settings.guarded_aliases(guarded_aliases)
        self.store = open_blob_store(self.blob_uri)
        self.meta = MetadataStore(self.db_url)
        self.leases = BlobLeases(self.meta)
        self.gate = gate if gate is not None else ChildWorkerGate()

    def as_user(self, user: str) -> "Registry":
        """The same registry (shared stores and connection pool) acting as `user`:
        the HTTP API calls this per request."""
        clone = object.__new__(Registry)
        clone.__dict__.update(self.__dict__)
        clone.user = user
        return clone

    # ------------------------------------------------------------------ reading

    def models(self) -> list[tuple[str, int, int]]:
        """(name, latest version, number of versions) per model."""
        return self.meta.models()

    def versions(self, name: str) -> list:
        """Every VersionRecord of `name`, oldest first (NotFoundError if the model does not exist)."""
        records = self.meta.versions(name)
        if not records:
            raise NotFoundError(f"model '{name}' does not exist; `normbridge models` lists the registered models.")
        return [self._assessed(r) for r in records]

    def show(self, ref: str):
        """The VersionRecord of 'name@N', 'name@alias' or 'name' (latest), with its servable verdict."""
        return self._assessed(self.meta.resolve(ref))

    def _assessed(self, record):
        """`record` with its servable verdict: as stored, or, for a version registered before verdicts were stored,
        assessed now from its manifest and (re-hashed) specs (registry/service/servable.py)."""
        if record.servable is not None:
            return record
        try:
            manifest = load_manifest(record.manifest)
            verdict = assess(manifest, specs_from_manifest(manifest, self.blob_reader(record)))
        except NormbridgeError as error:
            verdict = unassessable(str(error))
        servable, hazards = verdict.stored()
        return dataclasses.replace(record, servable=servable, hazards=hazards)

    def manifest(self, ref: str):
        """The validated ArtifactManifest of a version."""
        return load_manifest(self.show(ref).manifest)

    def aliases(self, name: str) -> list:
        return self.meta.aliases(name)

    def blob_reader(self, record) -> Callable[[str], bytes]:
        """A blob reader that names the version and tensor when stored bytes were tampered with (never serves them)."""
        names: dict[str, list[str]] = {}
        for tensor, ref in record.manifest.get("tensors", {}).items():
            names.setdefault(ref.get("digest"), []).append(tensor)
        for part, ref in (record.manifest.get("structure") or {}).get("parts", {}).items():
            names.setdefault(ref.get("digest"), []).append(f"structure:{part}")

        def get(digest: str) -> bytes:
            try:
                return self.store.get(digest)
            except IntegrityError as error:
                raise IntegrityError(
                    f"version {record.ref}: tensor '{', '.join(names.get(digest, ['?']))}' ({digest[:12]}) is tampered ({error}); "
                    "it is not served: restore the blob or delete the version."
                ) from error
            except NotFoundError as error:
                raise IntegrityError(
                    f"version {record.ref}: tensor '{', '.join(names.get(digest, ['?']))}' ({digest[:12]}) is missing from the blob "
                    "store; restore the blob or delete the version."
                ) from error

        return get

    def tensors(self, ref: str) -> dict:
        """The version's tensors as NumPy arrays (every blob re-hashed on read)."""
        record = self.show(ref)
        return tensors_from_blobs(self.manifest(record.ref), self.blob_reader(record))

    def specs(self, ref: str) -> list:
        """The version's NormSpecs, rebuilt from the manifest and the (re-hashed) blobs."""
        record = self.show(ref)
        return specs_from_manifest(self.manifest(record.ref), self.blob_reader(record))

    def diff(self, ref_a: str, ref_b: str):
        """ManifestDiff from version a to version b: per tensor and per normalizer, with a headline naming the case."""
        a, b = self.show(ref_a), self.show(ref_b)
        getters = {}
        for record in (a, b):
            get = self.blob_reader(record)
            for t in record.manifest.get("tensors", {}).values():
                getters.setdefault(t["digest"], get)
        return diff_manifests(
            self.manifest(a.ref),
            self.manifest(b.ref),
            lambda d: getters[d](d) if d in getters else self.store.get(d),
            label_a=a.ref,
            label_b=b.ref,
        )

    def lineage(self, ref: str):
        """LineageView of a version: its ancestors (nearest first) and all descendants, with operation labels."""
        record = self.show(ref)
        ancestors, descendants = self.meta.lineage_edges(record.model, record.number, manifests=False)
        return build_lineage(record, ancestors, descendants)

    # ------------------------------------------------------------------ writing (beyond register)

    def set_alias(self, name: str, alias: str, ref: str, force: bool = False):
        """Point `name@alias` at a version of `name`; every move is recorded in the alias history and the audit log.

        A guarded alias (`guarded_aliases`, production by default) is refused a version that is not servable
        (NotServableError naming the reasons, audited as 'alias_refused') unless `force`; the forced move's audit entry
        says it was forced and what it overrode."""
        if alias.isdigit() or not NAME.match(alias) or alias == "latest":
            raise InvalidReferenceError(
                f"alias '{alias}' is not valid; use a name that starts with a letter and is not a number or 'latest'."
            )
        if "@" not in ref and ref.isdigit():
            ref = f"{name}@{ref}"
        record = self.show(ref)
        if record.model != name:
            raise RegistryError(
                f"alias '{name}@{alias}' cannot point at '{record.ref}', a version of another model; pass a version of '{name}'."
            )
        try:
            forced = guard_alias(alias, record, self.guarded_aliases, force)
        except NotServableError as error:
            self.meta.append_audit(
                "alias_refused",
                name,
                record.number,
                {"alias": alias, "error": error.code, "message": str(error)},
                self.user,
            )
            raise
        return self.meta.set_alias(name, alias, record.number, self.user, audit=forced)

    def delete_version(self, ref: str) -> None:
        record = self.show(ref)
        self.meta.delete_version(record.model, record.number, self.user)

    # ------------------------------------------------------------------ the audit log

    def audit(self, model: str | None = None, user: str | None = None) -> list:
        """Audit entries (AuditRecord), oldest first, optionally for one model or one user."""
        return self.meta.audit(model=model, user=user)

    def verify_audit(self, pinned_head: str | None = None) -> list[str]:
        """Problems of the audit hash chain and its end (empty when intact); `pinned_head`:
        an entry hash that must be in it."""
        return self.meta.verify_audit(pinned_head)

    def check_audit(self, pinned_head: str | None = None):
        """The audit chain verified, with the head it ends at (registry.audit_chain.AuditCheck):
        what an operator pins."""
        return self.meta.check_audit(pinned_head)

    def verified_audit(self, pinned_head: str | None = None) -> tuple[list, Any]:
        """(every audit entry, their AuditCheck), read once: for pages that show the log and its verdict."""
        return self.meta.verified_audit(pinned_head)

    # ------------------------------------------------------------------ export

    def export(self, ref: str, to: str, folder: str | Path) -> RegistryExport:
        """Write every normalization layer of a version through the converters into `folder`, with each layer's report.

        `to`: 'onnx' (one .onnx file per layer), 'keras' (one .keras one-layer model per layer, loadable with
        safe_mode) or 'torch' (one safetensors state dict plus its spec per layer). The blobs are re-hashed on
        read, so a tampered version is never exported.
        """
        record = self.show(ref)
        return export_layers(self.manifest(record.ref), self.specs(record.ref), to, folder, record.ref)


__all__ = ["ModelRegistry", "Registry"]
