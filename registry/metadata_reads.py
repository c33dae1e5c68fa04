"""What the metadata store reads: models, versions, lineage, aliases, blob references and the audit log.

Every read runs in a read-only session (SQLite begins it deferred, so it never waits for a
writer); the audit log and its head are read in one snapshot, so a verdict never mixes two
states of the chain. `MetadataStore` (registry/metadata.py) adds the writes.
"""

from __future__ import annotations

from sqlalchemy import func, literal, select, text, union
from sqlalchemy.orm import aliased, sessionmaker

from registry.audit_chain import AuditCheck, AuditHead, check_head, verify_chain
from registry.db import queries
from registry.db.models import AliasHistoryRow, AliasRow, AuditHeadRow, AuditRow, BlobRefRow, ModelRow, VersionRow
from registry.entities import AliasRecord, AuditRecord, VersionRecord, split_ref
from schemas.errors import NotFoundError


class MetadataReads:
    """The reads of a metadata store; `_read_sessions` and `_snapshot_sessions` are set by MetadataStore."""

    _read_sessions: sessionmaker
    _snapshot_sessions: sessionmaker

    def models(self) -> list[tuple[str, int, int]]:
        """(name, latest number, number of versions) of every model that has versions, by name."""
        with self._read_sessions() as session:
            rows = session.execute(
                select(ModelRow.name, func.max(VersionRow.number), func.count(VersionRow.id))
                .join(VersionRow, VersionRow.model_id == ModelRow.id)
                .group_by(ModelRow.name)
                .order_by(ModelRow.name)
            ).all()
            return [(name, int(latest), int(count)) for name, latest, count in rows]

    def versions(self, model: str) -> list[VersionRecord]:
        with self._read_sessions() as session:
            owner = queries.model_row(session, model)
            return queries.records(session, VersionRow.model_id == owner.id, order=[VersionRow.number])

    def version(self, model: str, number: int) -> VersionRecord:
        with self._read_sessions() as session:
            return queries.record(session, queries.version_row(session, model, int(number)))

    def resolve(self, ref: str) -> VersionRecord:
        """'name@N', 'name@alias' or 'name' (its latest version)."""
        name, suffix = split_ref(ref)
        with self._read_sessions() as session:
            owner = queries.model_row(session, name)
            if suffix is None:
                newest = (
                    select(func.max(queries.OTHER_VERSION.number))
                    .where(queries.OTHER_VERSION.model_id == owner.id)
                    .scalar_subquery()
                )
                found = queries.records(session, (VersionRow.model_id == owner.id) & (VersionRow.number == newest))
                if not found:
                    raise NotFoundError(f"model {name!r} has no versions left; register one first")
                return found[0]
            if suffix.isdigit():
                # one query with the parent joined in; only a missing version pays for the message listing the others
                found = (
                    queries.records(session, (VersionRow.model_id == owner.id) & (VersionRow.number == int(suffix)))
                    if queries.storable_number(int(suffix))
                    else []
                )
                return (
                    found[0]
                    if found
                    else queries.record(session, queries.version_row(session, name, int(suffix), owner))
                )
            alias = session.get(AliasRow, (owner.id, suffix))
            if alias is None:
                known = session.scalars(
                    select(AliasRow.alias).where(AliasRow.model_id == owner.id).order_by(AliasRow.alias)
                ).all()
                raise NotFoundError(
                    f"{name} has no alias {suffix!r}; its aliases are {', '.join(known) if known else 'none'} "
                    f"(use NAME@N for a version number)"
                )
            return queries.record(session, alias.version)

    def lineage_edges(
        self, model: str, number: int, *, manifests: bool = True
    ) -> tuple[list[VersionRecord], list[VersionRecord]]:
        """(ancestors nearest first, all descendants by depth) of one version, by recursive CTEs.

        `manifests=False` returns the records with an empty `manifest`: decoding 1,000 manifests
        costs more than the whole graph query, and a lineage tree needs none of them.
        """
        with self._read_sessions() as session:
            if session.get_bind().dialect.name == "postgresql":
                # PostgreSQL plans the recursive term for a 10-row work table and picks a hash join
                # over a full scan of versions per step: O(n^2) on a chain (110 ms at 1,000 versions).
                # Index lookups per step make it ~1 ms; LOCAL ends with this read transaction.
                session.execute(text("SET LOCAL enable_hashjoin = off"))
                session.execute(text("SET LOCAL enable_mergejoin = off"))
            start = queries.version_row(session, model, int(number))
            up = (
                select(VersionRow.parent_id.label("id"), literal(1).label("depth"))
                .where(VersionRow.id == start.id, VersionRow.parent_id.is_not(None))
                .cte("ancestors", recursive=True)
            )
            step = aliased(VersionRow)
            up = up.union_all(
                select(step.parent_id, up.c.depth + 1).where(step.id == up.c.id, step.parent_id.is_not(None))
            )
            down = (
                select(VersionRow.id.label("id"), literal(1).label("depth"))
                .where(VersionRow.parent_id == start.id)
                .cte("descendants", recursive=True)
            )
            child = aliased(VersionRow)
            down = down.union_all(select(child.id, down.c.depth + 1).where(child.parent_id == down.c.id))
            ancestor_depth = dict(session.execute(select(up.c.id, up.c.depth)).all())
            descendant_depth = dict(session.execute(select(down.c.id, down.c.depth)).all())
            wanted = set(ancestor_depth) | set(descendant_depth)
            if not wanted:
                return [], []
            ids = sorted(wanted)
            by_id = {}
            for chunk in range(0, len(ids), 500):  # bounded IN lists
                part = VersionRow.id.in_(ids[chunk : chunk + 500])
                by_id.update(queries.records_by_id(session, part, manifests=manifests))
            ancestors = [by_id[i] for i in sorted(ancestor_depth, key=ancestor_depth.__getitem__)]
            descendants = [by_id[i] for i in sorted(descendant_depth, key=lambda i: (descendant_depth[i], i))]
            return ancestors, descendants

    def aliases(self, model: str) -> list[AliasRecord]:
        with self._read_sessions() as session:
            owner = queries.model_row(session, model)
            rows = session.scalars(select(AliasRow).where(AliasRow.model_id == owner.id).order_by(AliasRow.alias))
            return [row.to_record() for row in rows]

    def alias_history(self, model: str, alias: str) -> list[AliasRecord]:
        """Every move of `model@alias`, oldest first."""
        with self._read_sessions() as session:
            owner = queries.model_row(session, model)
            rows = session.scalars(
                select(AliasHistoryRow)
                .where(AliasHistoryRow.model_id == owner.id, AliasHistoryRow.alias == alias)
                .order_by(AliasHistoryRow.id)
            )
            return [row.to_record() for row in rows]

    def models_referencing(self, digests) -> dict[str, set[str]]:
        """digest -> names of the models with a version that references it (as a blob or as its artifact digest);
        digests nothing references are left out. Access checks on blobs are made from this."""
        wanted = sorted(set(digests))
        found: dict[str, set[str]] = {}
        with self._read_sessions() as session:
            for start in range(0, len(wanted), 500):  # bounded IN lists
                chunk = wanted[start : start + 500]
                by_blob = (
                    select(BlobRefRow.digest, ModelRow.name)
                    .join(VersionRow, BlobRefRow.version_id == VersionRow.id)
                    .join(ModelRow, VersionRow.model_id == ModelRow.id)
                    .where(BlobRefRow.digest.in_(chunk))
                )
                by_version = (
                    select(VersionRow.digest, ModelRow.name)
                    .join(ModelRow, VersionRow.model_id == ModelRow.id)
                    .where(VersionRow.digest.in_(chunk))
                )
                for digest, model in session.execute(union(by_blob, by_version)):
                    found.setdefault(digest, set()).add(model)
        return found

    def referenced_digests(self) -> set[str]:
        """Every digest a version still needs: its blobs and its artifact digest (what gc keeps)."""
        with self._read_sessions() as session:
            query = union(select(BlobRefRow.digest), select(VersionRow.digest))
            return set(session.scalars(query).all())

    def audit(self, model: str | None = None, user: str | None = None) -> list[AuditRecord]:
        """Audit entries in chain order, optionally only one model's or one user's."""
        with self._read_sessions() as session:
            query = select(AuditRow).order_by(AuditRow.seq)
            if model is not None:
                query = query.where(AuditRow.model == model)
            if user is not None:
                query = query.where(AuditRow.user == user)
            return [row.to_record() for row in session.scalars(query)]

    def verify_audit(self, pinned_head: str | None = None) -> list[str]:
        """Problems in the audit hash chain and at its end (empty when intact); see `check_audit`."""
        return self.check_audit(pinned_head).problems

    def check_audit(self, pinned_head: str | None = None) -> AuditCheck:
        """Verify the chain (every entry hashes to its successor's prev_hash) and its end: the head row names the last
        entry, and `pinned_head` (an entry hash printed earlier) is still in the chain."""
        return self.verified_audit(pinned_head)[1]

    def verified_audit(self, pinned_head: str | None = None) -> tuple[list[AuditRecord], AuditCheck]:
        """(every entry in chain order, their check as `check_audit` makes it), read in one snapshot."""
        with self._snapshot_sessions() as session:
            entries = [row.to_record() for row in session.scalars(select(AuditRow).order_by(AuditRow.seq))]
            row = session.execute(select(AuditHeadRow.seq, AuditHeadRow.hash).where(AuditHeadRow.id == 1)).first()
        head = None if row is None else AuditHead(row.seq, row.hash)
        return entries, AuditCheck(
            problems=verify_chain(entries) + check_head(entries, head, pinned_head), head=head, entries=len(entries)
        )


__all__ = ["MetadataReads"]
