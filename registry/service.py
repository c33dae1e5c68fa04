"""The registry as one object: the CLI and the HTTP API call only this.

`Registry` composes the blob store (bytes, content-addressed), the metadata store (versions,
lineage, aliases, audit log, all in SQL) and the artifact code (manifests, diffs, lineage
views). Registration order is what makes a crash harmless: every blob is staged while the
equivalence gate runs (hidden files locally; on S3 written at once, hashed first), published if
the gate passes (atomic, idempotent), then ONE transaction assigns the version number. A crash
or a refusal before the commit leaves only unreferenced blobs (and staging files), which `gc`
removes after a grace period; a crash after it leaves a whole version. Before it looks at the
store, a registration leases the digests it relies on, so gc (in any process) keeps them until
the commit, even blobs that were stored long ago (registry/blob_leases.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, ConfigDict, Field

from schemas.errors import CheckFailedError, IntegrityError, NormbridgeError, NotFoundError, PayloadTooLargeError, RegistryError

from . import settings
from .faults import fault_point

#: progress(step, done, total): called as a registration advances (the CLI draws a bar from it).
Progress = Callable[[str, int, int], None]

OPERATIONS = ("registered", "fine-tuned", "recalibrated", "converted", "imported")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class Registration:
    """What `register` did: the version (new, or the existing one with identical content) and the checks it passed."""

    version: Any  # registry.metadata.VersionRecord
    created: bool
    checks: list = field(default_factory=list)  # list[schemas.CheckResult]


class VerifyProblem(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    number: int
    kind: str  # "blob" | "tensor" | "check" | "audit"
    tensor: str | None = None
    message: str


class VerifyResult(BaseModel):
    """Outcome of `verify`: what was re-hashed and re-checked, and every problem found."""

    model_config = ConfigDict(frozen=True)

    versions: list[str] = Field(default_factory=list)
    blobs_checked: int = 0
    checks_run: int = 0
    audit_entries: int = 0
    problems: list[VerifyProblem] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_json(self, indent: int = 2) -> str:
        import json

        return json.dumps({**self.model_dump(mode="json"), "passed": self.passed}, indent=indent)

    def render_text(self) -> str:
        lines = [(f"verified {len(self.versions)} version(s): {self.blobs_checked} blob(s) re-hashed, {self.checks_run} equivalence check(s) re-run, "
                  f"{self.audit_entries} audit entries chained")]
        lines += [f"  {p.model}@{p.number} {p.kind}{' ' + p.tensor if p.tensor else ''}: {p.message}" for p in self.problems]
        lines.append("verify PASSED" if self.passed else f"verify FAILED ({len(self.problems)} problem(s))")
        return "\n".join(lines)


class GcResult(BaseModel):
    """Outcome of `gc`: unreferenced blobs deleted, and those kept because they are younger than the grace period."""

    model_config = ConfigDict(frozen=True)

    deleted: list[str] = Field(default_factory=list)
    bytes_freed: int = 0
    kept_young: list[str] = Field(default_factory=list)
    kept_in_flight: list[str] = Field(default_factory=list, description=(
        "Unreferenced when gc listed them, but leased by a registration in flight (or referenced by a version committed "
        "meanwhile): kept, whatever their age."))
    referenced: int = 0
    grace_seconds: float = 0.0
    staging_removed: int = Field(default=0, description="Hidden files of registrations that crashed before publishing their blobs.")

    def to_json(self, indent: int = 2) -> str:
        import json

        return json.dumps(self.model_dump(mode="json"), indent=indent)


class ExportedLayer(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    file: str
    report: str


class RegistryExport(BaseModel):
    """Outcome of `export`: one file per normalization layer, each with its conversion report."""

    model_config = ConfigDict(frozen=True)

    version: str
    to: str
    folder: str
    layers: list[ExportedLayer] = Field(default_factory=list)


def _ref(record) -> str:
    return f"{record.model}@{record.number}"


def _first_failure(result) -> str:
    """The reason a CheckResult failed, in one clause."""
    if result.errors:
        return result.errors[0]
    for t in result.targets:
        if t.status == "failed":
            return f"{t.framework}: {t.reason or 'failed'}"
    for o in result.outputs:
        if not o.passed:
            return f"eval {o.framework} max abs error {o.max_abs_error:.3e} exceeds atol {o.atol:g}"
    for s in result.training_step:
        if not s.passed:
            return f"training step on {s.framework} moved the running statistics differently from the reference"
    return "no target could express the layer"


class Registry:
    """A model registry on a metadata database and a blob store; zero configuration by default.

    Args:
        db: SQLAlchemy URL; default $NORMBRIDGE_DB, else SQLite under $NORMBRIDGE_HOME (~/.local/share/normbridge).
        blobs: blob store URI ('file:///abs/path' or a path); default $NORMBRIDGE_BLOBS, else `blobs/` there.
        user: recorded in the audit log; default $NORMBRIDGE_USER, else the login name.
    """

    def __init__(self, db: str | None = None, blobs: str | None = None, user: str | None = None):
        from .blob_leases import BlobLeases
        from .blobs import open_blob_store
        from .metadata import MetadataStore

        self.db_url = settings.database_url(db)
        self.blob_uri = settings.blobs_uri(blobs)
        self.user = settings.current_user(user)
        self.store = open_blob_store(self.blob_uri)
        self.meta = MetadataStore(self.db_url)
        self.leases = BlobLeases(self.meta)

    def as_user(self, user: str) -> "Registry":
        """The same registry (shared stores and connection pool) acting as `user`: the HTTP API calls this per request."""
        clone = object.__new__(Registry)
        clone.__dict__.update(self.__dict__)
        clone.user = user
        return clone

    # ------------------------------------------------------------------ registration

    def register(self, name: str, model: Any, parent: str | None = None, note: str | None = None, operation: str | None = None,
                 progress: Progress | None = None) -> Registration:
        """Register `model` as the next version of `name`, only if every normalizer passes the equivalence check.

        `model` is a torch module / ExportedProgram, keras.Model, onnx.ModelProto, or a path (.pt2, .keras, .onnx,
        or a saved artifact folder). Identical content returns the existing version (created=False). On any failure
        no version is created and the audit log records 'register_failed' (an S3 store may keep the staged blobs,
        referenced by nothing, until `gc`).

        Raises:
            CheckFailedError: a normalizer failed the round-trip check (names the layer and why).
            InputFileError / SpecError: the model or its state is unreadable (corrupt file, NaN statistics, ...).
            NotFoundError: `parent` does not exist.
        """
        report = progress or (lambda step, done, total: None)
        model_input = str(model) if isinstance(model, (str, Path)) else type(model).__name__
        return self._audited(name, model_input, lambda: self._register(name, model, parent, note, operation, report))

    def register_stream(self, name: str, stream: BinaryIO, limit: int, parent: str | None = None, note: str | None = None,
                        operation: str | None = None, progress: Progress | None = None,
                        reuse: Callable[[set[str]], set[str]] | None = None) -> Registration:
        """Register an artifact bundle (a tar of an artifact folder) while it is read from `stream`: the HTTP upload path.

        Each blob is hashed and checked against the manifest as it arrives, then staged; the gate starts as soon as
        the manifest and the normalizers' blobs are in (before the bulk weights have arrived when the bundle lists
        them first, as `normbridge --server` sends it); the blobs are published and the version committed only once
        the whole bundle has arrived and the gate has passed. Same guarantees and errors as `register`, plus
        PayloadTooLargeError past `limit` bytes. `reuse(digests)` names the blobs the bundle may leave out because the
        store holds them for this uploader (see bundle_stream.receive_bundle). An upload that never arrived whole (interrupted, or over the limit) is not audited: as for the
        other upload formats, no registration was attempted.
        """
        from .bundle_stream import UploadInterrupted

        report = progress or (lambda step, done, total: None)
        return self._audited(name, "bundle upload", lambda: self._register_stream(name, stream, limit, parent, note, operation, report, reuse),
                             unaudited=(UploadInterrupted, PayloadTooLargeError))

    def _audited(self, name: str, model_input: str, register: Callable[[], Registration], unaudited: tuple = ()) -> Registration:
        """Run a registration; a refusal is recorded in the audit log as 'register_failed' and re-raised."""
        self._check_name(name)
        try:
            return register()
        except unaudited:
            raise
        except NormbridgeError as error:
            self.meta.record_failure(name, self.user, {"error": error.code, "message": str(error), "layer": error.layer,
                                                       "model_input": model_input})
            raise

    def _register(self, name, model, parent, note, operation, report: Progress) -> Registration:
        from .artifact import extract_artifact

        is_folder = isinstance(model, (str, Path)) and Path(model).is_dir()
        parent_record, lineage = self._lineage(name, parent, operation, imported=is_folder)
        report("extracting the artifact", 0, 1)
        artifact = extract_artifact(model, lineage)
        items = list(artifact.blobs.items())
        lease = self.leases.new()
        try:
            lease.take(digest for digest, _ in items)  # before staging looks at the store: gc keeps them from now on
            # Blobs are staged while the gate runs and published only if it passes.
            with ThreadPoolExecutor(max_workers=1) as pool:
                staging = pool.submit(self._stage, items)
                try:
                    checks = self._gate(artifact.manifest, list(artifact.specs), report, artifact.sites)
                except BaseException:
                    self._discard(staging.result())
                    raise
                staged = staging.result()
            return self._commit(name, artifact.manifest, checks, staged, parent_record, note, report, lease)
        finally:
            lease.release()

    def _register_stream(self, name, stream, limit, parent, note, operation, report: Progress, reuse) -> Registration:
        from .bundle_stream import receive_bundle

        parent_record, lineage = self._lineage(name, parent, operation, imported=True)
        report("receiving the bundle", 0, 1)
        lease = self.leases.new()
        try:
            received = receive_bundle(stream, limit, self.store, lambda manifest, specs: self._gate(manifest, specs, report), reuse,
                                      claim=lease.take)
            manifest = received.manifest.model_copy(update={"lineage": lineage})
            return self._commit(name, manifest, received.checks, received.staged, parent_record, note, report, lease)
        finally:
            lease.release()

    def _lineage(self, name: str, parent: str | None, operation: str | None, imported: bool):
        """(parent record or None, Lineage): the parent is `parent`, else the latest version of `name`."""
        from schemas.manifest import Lineage

        parent_record = self._parent(name, parent)
        if operation is None:
            operation = "imported" if imported else ("registered" if parent_record is None else "fine-tuned")
        if operation not in OPERATIONS:
            raise RegistryError(f"operation '{operation}' is not known; use one of {', '.join(OPERATIONS)}.")
        return parent_record, Lineage(parent=_ref(parent_record) if parent_record else None, operation=operation)

    def _commit(self, name, manifest, checks, staged, parent_record, note, report: Progress, lease) -> Registration:
        """After the gate passed: publish the staged blobs, then ONE transaction assigns the version (crash-safe order)
        and ends the blob lease (registry.blob_leases.Lease.settle)."""
        manifest = manifest.model_copy(update={"equivalence": [c.model_dump(mode="json") for c in checks], "note": note})
        fault_point("after_check")
        self._publish(staged, report)
        fault_point("after_blobs")
        report("committing", 0, 1)
        operation = manifest.lineage.operation
        digests = [b.digest for b in staged]
        record, created = self.meta.add_version(
            name, manifest.digest(), manifest.content_digest(), manifest.model_dump(mode="json"), digests,
            (parent_record.model, parent_record.number) if parent_record else None, operation, note, self.user,
            guard=lambda session: lease.settle(session, self.store, digests))
        lease.committed = True
        fault_point("after_commit")
        report("committed", 1, 1)
        return Registration(version=record, created=created, checks=checks)

    def _publish(self, staged: list, report: Progress) -> None:
        for i, blob in enumerate(staged):
            report("storing blobs", i, len(staged))
            self.store.publish(blob)
        report("storing blobs", len(staged), len(staged))

    def _gate(self, manifest, specs, report: Progress, sites: int | None = None) -> list:
        """converters.check on every normalizer; CheckFailedError naming the first layer that fails.

        First coverage.check_registrable: every tensor record is valid and each of the `sites` normalization layers
        the model's reader found has a spec, so none passes unchecked."""
        import converters

        from .coverage import check_registrable

        check_registrable(manifest, specs, sites)
        checks = []
        for i, spec in enumerate(specs):
            report(f"checking {spec.name or i}", i, len(specs))
            result = converters.check(spec)
            checks.append(result)
            if not result.passed:
                layer = manifest.normalizers[i].path if i < len(manifest.normalizers) else spec.name
                raise CheckFailedError(
                    f"layer '{layer}' failed the round-trip equivalence check ({_first_failure(result)}); nothing was registered: "
                    "fix the layer's state or settings and register again.", result)
        return checks

    def _stage(self, items: list[tuple[str, bytes]]) -> list:
        """Stage every blob (several at once where the store gains from it); the digest each store computes must be the artifact's."""
        staged = []
        try:
            with ThreadPoolExecutor(max_workers=max(1, self.store.parallel_transfers)) as pool:
                for (digest, _), blob in zip(items, pool.map(lambda item: self.store.stage(item[1]), items)):
                    staged.append(blob)
                    if blob.digest != digest:
                        raise IntegrityError(f"blob for '{digest}' hashed to '{blob.digest}' on write; the artifact is inconsistent, "
                                             "extract it again.")
        except BaseException:
            self._discard(staged)
            raise
        return staged

    def _discard(self, staged: list) -> None:
        for blob in staged:
            self.store.discard(blob)

    def _parent(self, name: str, parent: str | None):
        if parent is not None:
            return self.meta.resolve(parent)
        try:
            return self.meta.resolve(name)
        except NotFoundError:
            return None

    @staticmethod
    def _check_name(name: str) -> None:
        if not _NAME.match(name or ""):
            raise RegistryError(f"model name '{name}' is not valid; use letters, digits, '.', '_' or '-' (no '@'), starting with a letter or digit.")

    # ------------------------------------------------------------------ reading

    def models(self) -> list[tuple[str, int, int]]:
        """(name, latest version, number of versions) per model."""
        return self.meta.models()

    def versions(self, name: str) -> list:
        """Every VersionRecord of `name`, oldest first (NotFoundError if the model does not exist)."""
        records = self.meta.versions(name)
        if not records:
            raise NotFoundError(f"model '{name}' does not exist; `normbridge models` lists the registered models.")
        return records

    def show(self, ref: str):
        """The VersionRecord of 'name@N', 'name@alias' or 'name' (latest)."""
        return self.meta.resolve(ref)

    def manifest(self, ref: str):
        """The validated ArtifactManifest of a version."""
        from schemas.manifest import load_manifest

        return load_manifest(self.show(ref).manifest)

    def aliases(self, name: str) -> list:
        return self.meta.aliases(name)

    def blob_reader(self, record) -> Callable[[str], bytes]:
        """A blob reader that names the version and tensor when stored bytes were tampered with (never serves them)."""
        names: dict[str, list[str]] = {}
        for tensor, ref in record.manifest.get("tensors", {}).items():
            names.setdefault(ref.get("digest"), []).append(tensor)

        def get(digest: str) -> bytes:
            try:
                return self.store.get(digest)
            except IntegrityError as error:
                raise IntegrityError(f"version {_ref(record)}: tensor '{', '.join(names.get(digest, ['?']))}' ({digest[:12]}) is tampered ({error}); "
                                     "it is not served: restore the blob or delete the version.") from error
            except NotFoundError as error:
                raise IntegrityError(f"version {_ref(record)}: tensor '{', '.join(names.get(digest, ['?']))}' ({digest[:12]}) is missing from the blob "
                                     "store; restore the blob or delete the version.") from error

        return get

    def tensors(self, ref: str) -> dict:
        """The version's tensors as NumPy arrays (every blob re-hashed on read)."""
        from .manifest_io import tensors_from_blobs

        record = self.show(ref)
        return tensors_from_blobs(self.manifest(_ref(record)), self.blob_reader(record))

    def specs(self, ref: str) -> list:
        """The version's NormSpecs, rebuilt from the manifest and the (re-hashed) blobs."""
        from .manifest_io import specs_from_manifest

        record = self.show(ref)
        return specs_from_manifest(self.manifest(_ref(record)), self.blob_reader(record))

    def diff(self, ref_a: str, ref_b: str):
        """ManifestDiff from version a to version b: per tensor and per normalizer, with a headline naming the case."""
        from .diff import diff_manifests

        a, b = self.show(ref_a), self.show(ref_b)
        getters = {}
        for record in (a, b):
            get = self.blob_reader(record)
            for t in record.manifest.get("tensors", {}).values():
                getters.setdefault(t["digest"], get)
        return diff_manifests(self.manifest(_ref(a)), self.manifest(_ref(b)), lambda d: getters[d](d) if d in getters else self.store.get(d),
                              label_a=_ref(a), label_b=_ref(b))

    def lineage(self, ref: str):
        """LineageView of a version: its ancestors (nearest first) and all descendants, with operation labels."""
        from . import lineage as lineage_module

        record = self.show(ref)
        ancestors, descendants = self.meta.lineage_edges(record.model, record.number, manifests=False)
        build = getattr(lineage_module, "build_lineage", None)
        if build is not None:
            return build(record, ancestors, descendants)
        return lineage_module.LineageView.from_records(record, ancestors, descendants)

    # ------------------------------------------------------------------ writing (beyond register)

    def set_alias(self, name: str, alias: str, ref: str):
        """Point `name@alias` at a version of `name`; every move is recorded in the alias history and the audit log."""
        if alias.isdigit() or not _NAME.match(alias) or alias == "latest":
            raise RegistryError(f"alias '{alias}' is not valid; use a name that starts with a letter and is not a number or 'latest'.")
        if "@" not in ref and ref.isdigit():
            ref = f"{name}@{ref}"
        record = self.meta.resolve(ref)
        if record.model != name:
            raise RegistryError(f"alias '{name}@{alias}' cannot point at '{_ref(record)}', a version of another model; pass a version of '{name}'.")
        return self.meta.set_alias(name, alias, record.number, self.user)

    def delete_version(self, ref: str) -> None:
        record = self.show(ref)
        self.meta.delete_version(record.model, record.number, self.user)

    # ------------------------------------------------------------------ integrity

    def verify(self, ref: str | None = None, rerun_checks: bool = True) -> VerifyResult:
        """Re-hash every blob of one version (or all), check its header against the manifest row and re-run the
        equivalence check; also verify the audit chain.

        Returns a VerifyResult listing every problem (a tampered tensor names its version); callers that
        must not serve a bad version raise on `not result.passed` (the CLI exits 12).
        """
        import converters

        from .manifest_io import specs_from_manifest
        from .tensor_blobs import stored_tensor_problem

        if ref is None:
            records = [r for name, _, _ in self.meta.models() for r in self.meta.versions(name)]
        else:
            records = [self.show(ref)]
        problems: list[VerifyProblem] = []
        blobs_checked = checks_run = 0
        for record in records:
            bad = False
            for tensor, t in record.manifest.get("tensors", {}).items():
                blobs_checked += 1
                problem = stored_tensor_problem(tensor, t)  # the row itself, before its digest is used
                try:
                    problem = problem or stored_tensor_problem(tensor, t, self.store.get(t["digest"]))
                except (IntegrityError, NotFoundError) as error:
                    bad = True
                    what = "tampered" if isinstance(error, IntegrityError) else "missing"
                    problems.append(VerifyProblem(model=record.model, number=record.number, kind="blob", tensor=tensor,
                                                  message=f"blob {t['digest'][:12]} is {what}: {error}"))
                if problem is not None:
                    bad = True
                    problems.append(VerifyProblem(model=record.model, number=record.number, kind="tensor", tensor=tensor, message=problem))
            if bad or not rerun_checks:
                continue
            try:
                specs = specs_from_manifest(self.manifest(_ref(record)), self.blob_reader(record))
                for spec in specs:
                    checks_run += 1
                    result = converters.check(spec)
                    if not result.passed:
                        problems.append(VerifyProblem(model=record.model, number=record.number, kind="check", tensor=spec.name,
                                                      message=_first_failure(result)))
            except NormbridgeError as error:
                problems.append(VerifyProblem(model=record.model, number=record.number, kind="check", message=str(error)))
        audit_problems = self.meta.verify_audit()
        problems += [VerifyProblem(model="-", number=0, kind="audit", message=p) for p in audit_problems]
        return VerifyResult(versions=[_ref(r) for r in records], blobs_checked=blobs_checked, checks_run=checks_run,
                            audit_entries=len(self.meta.audit()), problems=problems)

    def audit(self, model: str | None = None, user: str | None = None) -> list:
        """Audit entries (AuditRecord), oldest first, optionally for one model or one user."""
        return self.meta.audit(model=model, user=user)

    def verify_audit(self, pinned_head: str | None = None) -> list[str]:
        """Problems of the audit hash chain and its end (empty when intact); `pinned_head`: an entry hash that must be in it."""
        return self.meta.verify_audit(pinned_head)

    def check_audit(self, pinned_head: str | None = None):
        """The audit chain verified, with the head it ends at (registry.audit_chain.AuditCheck): what an operator pins."""
        return self.meta.check_audit(pinned_head)

    def verified_audit(self, pinned_head: str | None = None) -> tuple[list, Any]:
        """(every audit entry, their AuditCheck), read once: for pages that show the log and its verdict."""
        return self.meta.verified_audit(pinned_head)

    def gc(self, grace_seconds: float = 3600.0) -> GcResult:
        """Delete blobs no version references, no registration in flight has leased, and older than `grace_seconds`.

        Candidates are listed without a lock, then re-checked and deleted in batches under the 'blobs' lock, which
        registrations take to lease and to commit (see registry/blob_leases.py); the grace period still covers writers
        that take no lease (an older normbridge during an upgrade, or a blob put by hand).
        """
        if grace_seconds < 0:
            raise RegistryError(f"grace period {grace_seconds} s is negative; pass 0 or more seconds.")
        referenced = self.meta.referenced_digests()
        candidates, young = [], []
        for digest in list(self.store.digests()):
            if digest in referenced:
                continue
            try:
                (young if self.store.age_seconds(digest) < grace_seconds else candidates).append(digest)
            except NotFoundError:
                continue  # another gc deleted it meanwhile
        swept = self.leases.sweep(candidates, self.store)
        staging = self.leases.remove_stale_staging(self.store, grace_seconds)
        result = GcResult(deleted=swept.deleted, bytes_freed=swept.bytes_freed, kept_young=young, kept_in_flight=swept.kept_in_use,
                          referenced=len(referenced), grace_seconds=grace_seconds, staging_removed=staging)
        # Here, not in a shell, so every caller (`normbridge gc`, POST /gc) is audited alike.
        self.meta.append_audit("gc", None, None, {"deleted": len(result.deleted), "bytes_freed": result.bytes_freed,
                                                  "grace_seconds": result.grace_seconds}, self.user)
        return result

    # ------------------------------------------------------------------ export

    def export(self, ref: str, to: str, folder: str | Path) -> RegistryExport:
        """Write every normalization layer of a version through the converters into `folder`, with each layer's report.

        `to`: 'onnx' (one .onnx file per layer), 'keras' (one .keras one-layer model per layer, loadable with
        safe_mode) or 'torch' (one safetensors state dict plus its spec per layer). The blobs are re-hashed on
        read, so a tampered version is never exported.
        """
        record = self.show(ref)
        return export_layers(self.manifest(_ref(record)), self.specs(_ref(record)), to, folder, _ref(record))


def export_layers(manifest, specs: list, to: str, folder: str | Path, version: str) -> RegistryExport:
    """Write each normalizer of an artifact (manifest + its rebuilt specs) through the converters into `folder`.

    Shared by `Registry.export` and the HTTP client, which rebuilds the specs from a downloaded bundle.
    """
    from converters import write_layer
    from converters.api import write_spec
    from converters.options import ConversionOptions
    from schemas import ConversionReport

    if to not in ("onnx", "torch", "keras"):
        raise RegistryError(f"export to '{to}' is not supported; use 'torch', 'keras' or 'onnx'.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    layers = []
    for entry, spec in zip(manifest.normalizers, specs):
        obj, layer_report = write_spec(spec, to, ConversionOptions())
        report = ConversionReport(layers=[layer_report])
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", entry.path) or "layer"
        suffix = {"onnx": ".onnx", "keras": ".keras", "torch": ".safetensors"}[to]
        target = write_layer(obj, spec, to, folder / f"{stem}{suffix}")
        layers.append(ExportedLayer(path=entry.path, file=str(target), report=report.render_text()))
    return RegistryExport(version=version, to=to, folder=str(folder), layers=layers)


__all__ = ["OPERATIONS", "GcResult", "export_layers", "Registration", "Registry", "RegistryExport", "VerifyProblem", "VerifyResult"]
