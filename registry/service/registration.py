"""Registering a model: extract, lease, run the equivalence gate and stage the blobs, publish, then ONE commit.

Registration order is what makes a crash harmless: every blob is staged (hidden files locally, after the gate, or beside
it past STAGE_BESIDE_GATE_BYTES; a checkpoint folder's tensors on a local store while the folder is still being read,
registry/early_staging.py; on S3 written at once, hashed first, while the gate runs), published if the gate passes
(atomic, idempotent), then one transaction assigns the version number. A crash or a refusal before the commit leaves
only unreferenced blobs (and staging files), which `gc` removes after a grace period; a crash after it leaves a whole
version. Before it looks at the store, a registration leases the digests it relies on, so gc (in any process) keeps them
until the commit (registry/blob_leases.py). Every refusal is audited as 'register_failed'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, get_args

from converters.gate import Gate
from schemas import CheckResult
from schemas.errors import (
    CheckFailedError,
    IntegrityError,
    InvalidReferenceError,
    NormbridgeError,
    NotFoundError,
    PayloadTooLargeError,
    RegistryError,
    StorageFullError,
)
from schemas.manifest import Lineage, Operation

from ..artifact import extract_artifact
from ..recognition_gate import admit
from ..blob_leases import BlobLeases
from ..blobs.base import BlobStore
from ..bundle_stream import UploadInterrupted, receive_bundle
from ..coverage import check_registrable
from ..early_staging import EarlyStaging
from ..entities import NAME
from ..faults import fault_point
from ..metadata import MetadataStore
from ..streamed_blobs import BlobMap
from ..structure import structure_parts
from .results import Registration
from .servable import assess
from .structure_check import check_structure

#: Blob bytes from which a registration stages its blobs while the gate runs on any store (S3 always does): writing a
#: gigabyte takes seconds the gate's worker spends on another core; a refused version's staged blobs are discarded.
#: Below it, the few blobs are written after the gate passes, so a refusal writes nothing.
STAGE_BESIDE_GATE_BYTES = 64 << 20


def _blob_bytes(blobs, digests: list[str]) -> int:
    return sum(blobs.size(d) for d in digests) if isinstance(blobs, BlobMap) else sum(len(blobs[d]) for d in digests)


#: progress(step, done, total): called as a registration advances (the CLI draws a bar from it).
Progress = Callable[[str, int, int], None]

#: The lineage operations a version may record (the manifest's Operation).
OPERATIONS: tuple[str, ...] = get_args(Operation)


def first_failure(result: CheckResult) -> str:
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


@contextlib.contextmanager
def _step(seconds: dict[str, float], step: str) -> Iterator[None]:
    """Record the wall seconds the block took as `seconds[step]` (a Registration's `seconds`: where its time went)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[step] = time.perf_counter() - start


class Registrations:
    """The registering half of `Registry` (registry/service/__init__.py), on its stores and as its user."""

    store: BlobStore
    meta: MetadataStore
    leases: BlobLeases
    user: str
    gate: Gate

    def register(
        self,
        name: str,
        model: Any,
        parent: str | None = None,
        note: str | None = None,
        operation: str | None = None,
        progress: Progress | None = None,
        allow_unrecognised: bool = False,
        model_input: str | None = None,
    ) -> Registration:
        """Register `model` as the next version of `name`, only if every normalizer passes the equivalence check.

        `model` is a torch module / ExportedProgram, keras.Model, onnx.ModelProto, or a path (.pt2, .keras, .onnx,
        or a saved artifact folder). Identical content returns the existing version (created=False). On any failure
        no version is created and the audit log records 'register_failed' (an S3 store may keep the staged blobs,
        referenced by nothing, until `gc`).

        A model holding layers that look like normalizations and that no recognizer proved, or holding weights and no
        normalization at all, is refused unless `allow_unrecognised` (registry/recognition_gate.py).

        Raises:
            CheckFailedError: a normalizer failed the round-trip check (names the layer and why).
            UnrecognisedNormalizationError: unchecked normalization, and `allow_unrecognised` is False.
            InputFileError / SpecError: the model or its state is unreadable (corrupt file, NaN statistics, ...).
            NotFoundError: `parent` does not exist.
        """
        report = progress or (lambda step, done, total: None)
        if model_input is None:  # how the audit log names the model (a job run for a caller names it as the caller did)
            model_input = str(model) if isinstance(model, (str, Path)) else type(model).__name__
        return self._audited(
            name, model_input, lambda: self._register(name, model, parent, note, operation, report, allow_unrecognised)
        )

    def register_stream(
        self,
        name: str,
        stream: BinaryIO,
        limit: int,
        parent: str | None = None,
        note: str | None = None,
        operation: str | None = None,
        progress: Progress | None = None,
        reuse: Callable[[set[str]], set[str]] | None = None,
        allow_unrecognised: bool = False,
    ) -> Registration:
        """Register an artifact bundle (a tar of an artifact folder) while it is read from `stream`:
        the HTTP upload path.

        Each blob is hashed and checked against the manifest as it arrives, then staged; the gate starts as soon as the
        manifest and the normalizers' blobs are in (before the bulk weights have arrived when the bundle lists them
        first, as `normbridge --server` sends it); the blobs are published and the version committed only once the whole
        bundle has arrived and the gate has passed. Same guarantees and errors as `register`, plus PayloadTooLargeError
        past `limit` bytes. `reuse(digests)` names the blobs the bundle may leave out because the store holds them for
        this uploader (see bundle_stream.receive_bundle). An upload that never arrived whole (interrupted, or over the
        limit) is not audited: as for the other upload formats, no registration was attempted.
        """
        report = progress or (lambda step, done, total: None)
        return self._audited(
            name,
            "bundle upload",
            lambda: self._register_stream(
                name, stream, limit, parent, note, operation, report, reuse, allow_unrecognised
            ),
            unaudited=(UploadInterrupted, PayloadTooLargeError),
        )

    def _audited(
        self, name: str, model_input: str, register: Callable[[], Registration], unaudited: tuple = ()
    ) -> Registration:
        """Run a registration; a refusal is recorded in the audit log as 'register_failed' and re-raised."""
        self._check_name(name)
        try:
            return register()
        except unaudited:
            raise
        except NormbridgeError as error:
            try:
                self.meta.record_failure(
                    name,
                    self.user,
                    {"error": error.code, "message": str(error), "layer": error.layer, "model_input": model_input},
                )
            except StorageFullError:
                # a database with no room cannot hold the refusal's entry either: the refusal itself is what to report
                pass
            raise

    def _register(
        self, name, model, parent, note, operation, report: Progress, allow_unrecognised: bool
    ) -> Registration:
        is_folder = isinstance(model, (str, Path)) and Path(model).is_dir()
        parent_record, lineage = self._lineage(name, parent, operation, imported=is_folder)
        report("extracting the artifact", 0, 1)
        seconds: dict[str, float] = {}
        early = EarlyStaging.start(model, self.store) if is_folder else None  # its bytes staged while the model is read
        try:
            with _step(seconds, "reading"):
                artifact = extract_artifact(model, lineage, early.digest_of if early is not None else None)
            return self._gate_and_commit(
                name, artifact, parent_record, note, report, allow_unrecognised, seconds, early
            )
        finally:
            if early is not None:
                early.close()

    def _gate_and_commit(
        self, name, artifact, parent_record, note, report: Progress, allow_unrecognised: bool, seconds, early
    ) -> Registration:
        digests = list(artifact.blobs)
        lease = self.leases.new()
        try:
            lease.take(digests)  # before staging looks at the store: gc keeps them from now on
            # Blobs are staged (beside the gate where the store gains: stages_beside_gate) and a structure no reader has
            # seen is checked; the blobs are published only if both pass.
            with ThreadPoolExecutor(max_workers=2) as pool:
                beside = (
                    self.store.stages_beside_gate or _blob_bytes(artifact.blobs, digests) >= STAGE_BESIDE_GATE_BYTES
                )
                staging = pool.submit(self._stage, artifact.blobs, digests, early) if beside else None
                structure = (
                    None
                    if artifact.structure_read_safely
                    else pool.submit(
                        check_structure,
                        artifact.manifest,
                        structure_parts(artifact.manifest, artifact.blobs.__getitem__),
                    )
                )
                try:
                    with _step(seconds, "gate"):
                        checks = self._gate(
                            artifact.manifest, list(artifact.specs), report, artifact.sites, allow_unrecognised
                        )
                        if structure is not None:
                            structure.result()
                except BaseException:
                    if staging is not None:
                        self._discard(staging.result())
                    raise
                with _step(seconds, "staging"):  # beside the gate, only what is left of it
                    staged = staging.result() if staging is not None else self._stage(artifact.blobs, digests, early)
            manifest = admit(
                artifact.manifest, allow_unrecognised
            )  # the gate admitted it: now it holds its unchecked layers
            with _step(seconds, "commit"):
                done = self._commit(
                    name, manifest, checks, staged, parent_record, note, report, lease, assess(manifest, artifact.specs)
                )
            return dataclasses.replace(done, seconds=seconds)
        finally:
            lease.release()

    def _register_stream(
        self, name, stream, limit, parent, note, operation, report: Progress, reuse, allow_unrecognised: bool
    ) -> Registration:
        parent_record, lineage = self._lineage(name, parent, operation, imported=True)
        report("receiving the bundle", 0, 1)
        lease = self.leases.new()
        try:
            # A bundle's manifest says itself what it leaves unchecked (the uploader's reader found it):
            # admitted before the gate.
            checked: list = []  # the specs the gate checked, for the servable verdict

            def gate(manifest, specs, held):
                checked[:] = specs
                checks = self._gate(manifest, specs, report, allow_unrecognised=allow_unrecognised)
                check_structure(
                    manifest, structure_parts(manifest, held)
                )  # an uploaded structure is hostile until a reader accepts it
                return checks

            received = receive_bundle(stream, limit, self.store, gate, reuse, claim=lease.take)
            manifest = admit(received.manifest, allow_unrecognised).model_copy(update={"lineage": lineage})
            return self._commit(
                name,
                manifest,
                received.checks,
                received.staged,
                parent_record,
                note,
                report,
                lease,
                assess(manifest, checked),
            )
        finally:
            lease.release()

    def _lineage(self, name: str, parent: str | None, operation: str | None, imported: bool):
        """(parent record or None, Lineage): the parent is `parent`, else the latest version of `name`, except for the
        operation "registered" given without a parent: a model made from scratch (retrained),
        which descends from none."""
        parent_record = None if operation == "registered" and parent is None else self._parent(name, parent)
        if operation is None:
            operation = "imported" if imported else ("registered" if parent_record is None else "fine-tuned")
        if operation not in OPERATIONS:
            raise RegistryError(f"operation '{operation}' is not known; use one of {', '.join(OPERATIONS)}.")
        return parent_record, Lineage(parent=parent_record.ref if parent_record else None, operation=operation)

    def _commit(
        self, name, manifest, checks, staged, parent_record, note, report: Progress, lease, verdict
    ) -> Registration:
        """After the gate passed (and a reader accepted the structure: every path checks it before it gets here):
        publish the staged blobs, then ONE transaction assigns the version with its servable `verdict` and its structure
        recorded as checked (crash-safe order) and ends the blob lease (registry.blob_leases.Lease.settle)."""
        manifest = manifest.model_copy(
            update={"equivalence": [c.model_dump(mode="json") for c in checks], "note": note}
        )
        fault_point("after_check")
        self._publish(staged, report)
        fault_point("after_blobs")
        report("committing", 0, 1)
        operation = manifest.lineage.operation
        digests = [b.digest for b in staged]
        digest, content_digest, document = manifest.digests_and_document()
        record, created = self.meta.add_version(
            name,
            digest,
            content_digest,
            document,
            digests,
            (parent_record.model, parent_record.number) if parent_record else None,
            operation,
            note,
            self.user,
            guard=lambda session: lease.settle(session, self.store, digests),
            verdict=verdict.stored(),
            structure_checked=True if manifest.structure is not None else None,
        )
        lease.committed = True
        fault_point("after_commit")
        report("committed", 1, 1)
        return Registration(version=record, created=created, checks=checks, unrecognised=list(manifest.unrecognised))

    def _publish(self, staged: list, report: Progress) -> None:
        self.store.publish_all(staged, lambda i: report("storing blobs", i, len(staged)))
        report("storing blobs", len(staged), len(staged))

    def _gate(
        self, manifest, specs, report: Progress, sites: int | None = None, allow_unrecognised: bool | None = None
    ) -> list:
        """converters.check on every normalizer, where `self.gate` runs it (converters/gate/gates.py); CheckFailedError
        naming the first layer that fails.

        First coverage.check_registrable: every tensor record is valid and each of the `sites` normalization layers
        the model's reader found has a spec, so none passes unchecked."""
        check_registrable(manifest, specs, sites)
        if (
            allow_unrecognised is not None
        ):  # what the model leaves unchecked is refused once its records are known sound
            admit(manifest, allow_unrecognised)
        results = self.gate.check_all(specs, lambda i, spec: report(f"checking {spec.name or i}", i, len(specs)))
        checks = []
        for i, (spec, result) in enumerate(zip(specs, results)):
            checks.append(result)
            if not result.passed:
                layer = manifest.normalizers[i].path if i < len(manifest.normalizers) else spec.name
                raise CheckFailedError(
                    f"layer '{layer}' failed the round-trip equivalence check ({first_failure(result)}); nothing was registered: "
                    "fix the layer's state or settings and register again.",
                    result,
                )
        return checks

    def _stage(self, blobs, digests: list[str], early: EarlyStaging | None = None) -> list:
        """Stage every blob (several at once where the store gains from it); the digest each store computes must be the
        artifact's.

        An extracted model's blobs (registry/streamed_blobs.BlobMap) are streamed into the store a chunk at a time from
        where the model file holds them, and hashed again on the way; those `early` staged already are taken as they
        are."""

        def stage(digest: str):  # synced together below
            staged = early.take(digest) if early is not None else None
            if staged is not None:
                return staged
            if isinstance(blobs, BlobMap):
                return self.store.stage_stream(blobs.chunks(digest), digest, blobs.size(digest), sync=False)
            return self.store.stage(blobs[digest], sync=False)

        staged = []
        try:
            parallel = self.store.parallel_transfers > 1  # else one at a time, here: a thread costs more than it saves
            with ThreadPoolExecutor(self.store.parallel_transfers) if parallel else contextlib.nullcontext() as pool:
                for digest, blob in zip(digests, pool.map(stage, digests) if parallel else map(stage, digests)):
                    staged.append(blob)
                    if blob.digest != digest:
                        raise IntegrityError(
                            f"blob for '{digest}' hashed to '{blob.digest}' on write; the artifact is inconsistent, "
                            "extract it again."
                        )
            self.store.sync(staged)  # all at once: one sync each, after the writes started their writeback
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
        if not NAME.match(name or ""):
            raise InvalidReferenceError(
                f"model name '{name}' is not valid; use letters, digits, '.', '_' or '-' (no '@'), starting with a letter or digit."
            )


__all__ = ["NAME", "OPERATIONS", "Progress", "Registrations", "first_failure"]
