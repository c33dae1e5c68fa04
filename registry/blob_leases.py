"""Blob leases: gc never deletes a blob that a registration relies on, in any process, on any database and store.

The race they close: a registration that finds a blob already stored (say an old one whose only version was
deleted) relies on it without writing it again, so the blob stays old and unreferenced until the commit; gc, in
this or another process, deletes unreferenced blobs older than its grace period. Refreshing the blob's age does not
help: gc may have decided already. The rule, for every registration (file or streamed bundle) and every gc:

1. Before the registration looks at the store (staging, or checking the blobs a bundle left out), it records
   every digest of its manifest as a lease (table blob_leases) in a transaction of its own, committed.
2. gc lists and ages blobs without a lock, then deletes in batches. Each batch, in one transaction holding the
   'blobs' lock EXCLUSIVELY, re-reads in one statement which of its candidates a version references or a lease
   holds, deletes the others from the store, and only then commits.
3. The commit (MetadataStore.add_version) ends the lease in the transaction that writes the version's blob
   references, holding the 'blobs' lock SHARED, and a failed registration deletes its lease.

Why nothing committed can lose a blob: taking a lease (which holds the lock shared) and a gc batch exclude each
other. So a lease is either committed before a batch starts, and the batch sees it and keeps the blob, or committed
after the batch has finished deleting; staging runs after the lease, so the registration then finds the blob absent
and writes it again. From the lease's commit to the version's commit the digest is leased, from then on it is
referenced, and the commit (lock shared) cannot interleave with a batch (lock exclusive). gc's staging sweep runs
under the same lock and keeps the hidden files and multipart uploads of leased digests.

A lease lasts LEASE_SECONDS, far above any registration, so a crashed registration's blobs are kept that long and
then swept. A registration slower than TRUSTED_SECONDS (half of that, a margin for clocks that differ between hosts)
does not trust its lease at the commit: it checks, under the lock, that every blob is still stored, and is refused
if one is gone. The lock is the 'blobs' row of registry_locks FOR SHARE / FOR UPDATE on PostgreSQL; on SQLite every
write transaction holds the database's write lock (BEGIN IMMEDIATE), which excludes the same way.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, insert, select, union
from sqlalchemy.orm import Session, sessionmaker

from registry.db.models import BlobLeaseRow, BlobRefRow, LockRow, VersionRow
from schemas.errors import NotFoundError, RegistryError, StorageFullError

from .blobs.base import BlobStore

#: How long a lease protects its blobs: a crashed registration's are swept by gc after this.
LEASE_SECONDS = 24 * 3600.0
#: A lease older than this at the commit is not trusted: the blobs are checked in the store instead.
TRUSTED_SECONDS = LEASE_SECONDS / 2
#: Candidates deleted per locked gc transaction (registrations wait at most one batch).
GC_BATCH = 200
LOCK = "blobs"


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _lock(session: Session, *, exclusive: bool) -> None:
    """Take the 'blobs' lock: gc exclusively, registrations shared (on SQLite the write lock is already held)."""
    query = select(LockRow.name).where(LockRow.name == LOCK).with_for_update(read=not exclusive)
    if session.scalars(query).one_or_none() is None:
        raise RegistryError(
            f"the '{LOCK}' row of registry_locks is missing, so blob leases cannot be kept; "
            "open the registry with this version of normbridge so its migrations run (alembic upgrade head)"
        )


def _expire(session: Session) -> None:
    session.execute(delete(BlobLeaseRow).where(BlobLeaseRow.taken_at < _now() - timedelta(seconds=LEASE_SECONDS)))


@dataclass
class Sweep:
    """What gc's locked batches did: deleted blobs, bytes freed, and candidates kept because they are in use."""

    deleted: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    kept_in_use: list[str] = field(default_factory=list)


class BlobLeases:
    """Leases in the registry database (table blob_leases), sharing the MetadataStore's engine."""

    def __init__(self, meta):
        self._sessions = sessionmaker(meta.engine, expire_on_commit=False)

    def new(self) -> Lease:
        """A lease that holds nothing yet (`Lease.take` adds digests)."""
        return Lease(self, secrets.token_hex(16))

    def sweep(self, candidates: list[str], store: BlobStore) -> Sweep:
        """Delete every candidate that, re-read under the exclusive lock, no version references and no lease holds."""
        result = Sweep()
        for start in range(0, len(candidates), GC_BATCH):
            batch = candidates[start : start + GC_BATCH]
            with self._sessions() as session, session.begin():
                _lock(session, exclusive=True)
                _expire(session)
                in_use = set(
                    session.scalars(
                        union(
                            select(BlobRefRow.digest).where(BlobRefRow.digest.in_(batch)),
                            select(VersionRow.digest).where(VersionRow.digest.in_(batch)),
                            select(BlobLeaseRow.digest).where(BlobLeaseRow.digest.in_(batch)),
                        )
                    )
                )
                for digest in batch:
                    if digest in in_use:
                        result.kept_in_use.append(digest)
                        continue
                    try:
                        size = store.size(digest)
                    except NotFoundError:
                        continue  # another gc deleted it meanwhile
                    store.delete(digest)  # before the commit: a registration waiting for the lock then finds it absent
                    result.deleted.append(digest)
                    result.bytes_freed += size
        return result

    def remove_stale_staging(self, store: BlobStore, older_than_seconds: float) -> int:
        """The store's staging sweep under the exclusive lock, keeping what leased digests are being written as."""
        with self._sessions() as session, session.begin():
            _lock(session, exclusive=True)
            _expire(session)
            leased = set(session.scalars(select(BlobLeaseRow.digest)))
            return store.remove_stale_staging(
                older_than_seconds, keep=lambda start: any(d.startswith(start) for d in leased)
            )


@dataclass
class Lease:
    """One registration's claim on the digests it relies on, from before it looks at the store until its commit."""

    leases: BlobLeases
    id: str
    digests: set[str] = field(default_factory=set)
    committed: bool = False

    def take(self, digests: Iterable[str]) -> None:
        """Record `digests` as relied on (committed at once, after any gc batch in progress has finished)."""
        new = sorted(set(digests) - self.digests)
        if not new:
            return
        with self.leases._sessions() as session, session.begin():
            _lock(session, exclusive=False)
            at = _now()
            # one executemany, not an ORM object per digest (221 rows: about a millisecond against tens)
            session.execute(
                insert(BlobLeaseRow), [{"lease": self.id, "digest": digest, "taken_at": at} for digest in new]
            )
        self.digests.update(new)

    def settle(self, session: Session, store: BlobStore, digests: Iterable[str]) -> None:
        """Inside the commit's transaction: end the lease; blobs it no longer vouches for must still be in the store.

        Raises:
            RegistryError: a blob the version needs was removed by gc after the lease expired.
        """
        _lock(session, exclusive=False)
        trusted = set(
            session.scalars(
                select(BlobLeaseRow.digest).where(
                    BlobLeaseRow.lease == self.id, BlobLeaseRow.taken_at >= _now() - timedelta(seconds=TRUSTED_SECONDS)
                )
            )
        )
        session.execute(delete(BlobLeaseRow).where(BlobLeaseRow.lease == self.id))
        gone = [digest for digest in sorted(set(digests) - trusted) if not store.exists(digest)]
        if gone:
            raise RegistryError(
                f"blob {gone[0]} ({len(gone)} in all) was removed by gc while this registration ran, longer than its "
                f"{TRUSTED_SECONDS / 3600:g} h blob lease; nothing was registered: register the model again"
            )

    def release(self) -> None:
        """End a lease whose registration did not commit (nothing to do after a commit, or if nothing was taken).

        On a database with no room left (StorageFullError) the lease is left to expire after LEASE_SECONDS: a lease is
        released only on a registration's way out after a failure, and that failure is the error to report."""
        if self.committed or not self.digests:
            return
        try:
            with self.leases._sessions() as session, session.begin():
                _lock(
                    session, exclusive=False
                )  # never interleaves with gc's removal of expired leases (no lock-order deadlock)
                session.execute(delete(BlobLeaseRow).where(BlobLeaseRow.lease == self.id))
        except StorageFullError:
            return
        self.digests.clear()


__all__ = ["GC_BATCH", "LEASE_SECONDS", "TRUSTED_SECONDS", "BlobLeases", "Lease", "Sweep"]
