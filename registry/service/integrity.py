"""Integrity of a registry: `verify` re-hashes and re-checks what is stored, `gc` removes what nothing needs.

Both run the same way from every caller (the CLI, the HTTP API), so both are audited here: gc
writes its audit entry itself, and verify reads the audit chain as part of its verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import converters
from schemas.errors import IntegrityError, NormbridgeError, NotFoundError, RegistryError

from ..blob_leases import BlobLeases
from ..blobs.base import BlobStore
from ..manifest_io import specs_from_manifest
from ..metadata import MetadataStore
from ..tensor_blobs import stored_tensor_problem
from .registration import first_failure
from .results import GcResult, VerifyProblem, VerifyResult


class Integrity:
    """The verifying and collecting half of `Registry` (registry/service/__init__.py)."""

    store: BlobStore
    meta: MetadataStore
    leases: BlobLeases
    user: str
    show: Callable[[str], Any]
    manifest: Callable[[str], Any]
    blob_reader: Callable[[Any], Callable[[str], bytes]]

    def verify(self, ref: str | None = None, rerun_checks: bool = True) -> VerifyResult:
        """Re-hash every blob of one version (or all), check its header against the manifest row and re-run the
        equivalence check; also verify the audit chain.

        Returns a VerifyResult listing every problem (a tampered tensor names its version); callers that
        must not serve a bad version raise on `not result.passed` (the CLI exits 12).
        """
        if ref is None:
            records = [r for name, _, _ in self.meta.models() for r in self.meta.versions(name)]
        else:
            records = [self.show(ref)]
        problems: list[VerifyProblem] = []
        blobs_checked = checks_run = 0
        for record in records:
            bad = False
            parts = (record.manifest.get("structure") or {}).get("parts", {})
            rows = [
                *record.manifest.get("tensors", {}).items(),
                *((f"structure:{part}", t) for part, t in parts.items()),
            ]
            for tensor, t in rows:  # the tensors, then the structure parts (each a uint8 tensor blob)
                blobs_checked += 1
                problem = stored_tensor_problem(tensor, t)  # the row itself, before its digest is used
                try:
                    problem = problem or stored_tensor_problem(tensor, t, self.store.get(t["digest"]))
                except (IntegrityError, NotFoundError) as error:
                    bad = True
                    what = "tampered" if isinstance(error, IntegrityError) else "missing"
                    problems.append(
                        VerifyProblem(
                            model=record.model,
                            number=record.number,
                            kind="blob",
                            tensor=tensor,
                            message=f"blob {t['digest'][:12]} is {what}: {error}",
                        )
                    )
                if problem is not None:
                    bad = True
                    problems.append(
                        VerifyProblem(
                            model=record.model, number=record.number, kind="tensor", tensor=tensor, message=problem
                        )
                    )
            if bad or not rerun_checks:
                continue
            try:
                specs = specs_from_manifest(self.manifest(record.ref), self.blob_reader(record))
                for spec in specs:
                    checks_run += 1
                    result = converters.check(spec)
                    if not result.passed:
                        problems.append(
                            VerifyProblem(
                                model=record.model,
                                number=record.number,
                                kind="check",
                                tensor=spec.name,
                                message=first_failure(result),
                            )
                        )
            except NormbridgeError as error:
                problems.append(
                    VerifyProblem(model=record.model, number=record.number, kind="check", message=str(error))
                )
        audit_problems = self.meta.verify_audit()
        problems += [VerifyProblem(model="-", number=0, kind="audit", message=p) for p in audit_problems]
        return VerifyResult(
            versions=[r.ref for r in records],
            blobs_checked=blobs_checked,
            checks_run=checks_run,
            audit_entries=len(self.meta.audit()),
            problems=problems,
        )

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
        result = GcResult(
            deleted=swept.deleted,
            bytes_freed=swept.bytes_freed,
            kept_young=young,
            kept_in_flight=swept.kept_in_use,
            referenced=len(referenced),
            grace_seconds=grace_seconds,
            staging_removed=staging,
        )
        # Here, not in a shell, so every caller (`normbridge gc`, POST /gc) is audited alike.
        self.meta.append_audit(
            "gc",
            None,
            None,
            {"deleted": len(result.deleted), "bytes_freed": result.bytes_freed, "grace_seconds": result.grace_seconds},
            self.user,
        )
        return result


__all__ = ["Integrity"]
