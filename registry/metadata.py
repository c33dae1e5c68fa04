"""The registry's metadata store: versions, lineage, aliases and the audit log in any SQL database.

One SQLAlchemy URL selects the database (SQLite by default, PostgreSQL tested); the schema is
created and upgraded only by Alembic (registry/migrations), never by `create_all`. Every write
is one transaction. Version numbers come from a per-model counter read under a lock (the model
row FOR UPDATE on PostgreSQL; SQLite serialises writers with BEGIN IMMEDIATE), so concurrent
registrations get consecutive numbers; the audit log is a hash chain appended under a second,
global lock (the 'audit' row of registry_locks), always taken last. Each append continues from
the chain's head (table audit_head) and moves it in the same transaction, so entries deleted from
the log's end leave a head that no longer matches (registry/audit_chain.py).

The engine is registry/db/engine.py, the queries reads and writes share registry/db/queries.py,
the reads registry/metadata_reads.py.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from registry.db import queries
from registry.db.engine import READ_ONLY, alembic_config, at_head, make_engine, now
from registry.db.models import AliasHistoryRow, AliasRow, BlobRefRow, VersionRow
from registry.entities import AliasRecord, AuditRecord, VersionRecord
from registry.metadata_reads import MetadataReads
from schemas.errors import RegistryError


class MetadataStore(MetadataReads):
    """Versions, lineage, aliases and the audit chain of one registry database (the reads are MetadataReads')."""

    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._read_sessions = sessionmaker(self.engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False)
        # One snapshot for reads that must agree with each other (the audit log and its head): a SQLite read
        # transaction already is one; PostgreSQL's default READ COMMITTED takes a new snapshot per statement.
        snapshot = {"isolation_level": "REPEATABLE READ"} if self.engine.dialect.name == "postgresql" else {}
        self._snapshot_sessions = sessionmaker(
            self.engine.execution_options(**{READ_ONLY: True}, **snapshot), expire_on_commit=False
        )
        self.upgrade()

    def __repr__(self) -> str:
        return f"MetadataStore({make_url(self.url).render_as_string(hide_password=True)!r})"

    def close(self) -> None:
        self.engine.dispose()

    def upgrade(self) -> None:
        """Apply every pending Alembic migration (upgrade head); a database at the head is left alone without loading
        Alembic."""
        if at_head(self.engine):
            return
        from alembic import command

        with self.engine.connect() as connection:
            command.upgrade(alembic_config(connection), "head")
            connection.commit()

    # ---------------------------------------------------------------- writes

    def add_version(
        self,
        model: str,
        digest: str,
        content_digest: str,
        manifest: dict,
        blob_digests: list[str],
        parent: tuple[str, int] | None,
        operation: str,
        note: str | None,
        user: str,
        guard: Callable[[Session], None] | None = None,
        verdict: tuple[bool, list[dict]] | None = None,
        structure_checked: bool | None = None,
    ) -> tuple[VersionRecord, bool]:
        """Register a version in one transaction; identical content returns the existing version.

        `guard(session)` runs first inside that transaction and may refuse: the registry ends the registration's blob
        lease there (registry/blob_leases.py), atomically with the blob references that replace it. `verdict` is
        (servable, hazards) as registry/service/servable.py computed it; a version that is not servable says so in its
        audit entry. `structure_checked`: a safe reader accepted the stored structure
        (registry/service/structure_check.py).
        """
        if not model or "@" in model:
            raise RegistryError(f"model name {model!r} is not allowed; use a non-empty name without '@'")
        with self._sessions() as session, session.begin():
            model_row = queries.lock_or_create_model(session, model)
            if guard is not None:
                guard(session)
            existing = session.scalars(
                select(VersionRow).where(
                    VersionRow.model_id == model_row.id, VersionRow.content_digest == content_digest
                )
            ).one_or_none()
            if existing is not None:
                queries.append_audit(
                    session,
                    user,
                    "register_existing",
                    model,
                    existing.number,
                    {"digest": digest, "content_digest": content_digest, "existing_digest": existing.digest},
                )
                return queries.record(session, existing), False
            parent_id = None
            if parent is not None:
                parent_id = queries.version_row(session, parent[0], int(parent[1])).id
            model_row.last_number += 1
            row = VersionRow(
                model_id=model_row.id,
                number=model_row.last_number,
                digest=digest,
                content_digest=content_digest,
                manifest=manifest,
                parent_id=parent_id,
                operation=operation,
                note=note,
                created_at=now(),
                user=user,
                servable=None if verdict is None else verdict[0],
                hazards=None if verdict is None else verdict[1],
                structure_checked=structure_checked,
            )
            session.add(row)
            session.flush()
            references = [{"version_id": row.id, "digest": blob} for blob in sorted(set(blob_digests))]
            if references:  # one executemany (an empty list would insert one row of defaults)
                session.execute(insert(BlobRefRow), references)
            detail = {"digest": digest, "content_digest": content_digest, "operation": operation}
            if manifest.get("unrecognised"):
                # Registered with --allow-unrecognised: the audit log says which layers were left unchecked.
                detail["allowed_unrecognised"] = [entry["path"] for entry in manifest["unrecognised"]]
            if parent is not None:
                detail["parent"] = f"{parent[0]}@{int(parent[1])}"
            if verdict is not None and not verdict[0]:
                detail["not_servable"] = sorted({h["code"] for h in verdict[1] if h.get("blocking")})
            queries.append_audit(session, user, "register", model, row.number, detail)
            return queries.record(session, row), True

    def append_audit(
        self,
        action: str,
        model: str | None,
        number: int | None,
        detail: dict,
        user: str,
        session: Session | None = None,
    ) -> AuditRecord:
        """Append one chained entry for a write that is not a version (gc, token create/revoke).

        Pass `session` (inside its open transaction) to make the entry atomic with that write.
        """
        if session is not None:
            return queries.append_audit(session, user, action, model, number, detail).to_record()
        with self._sessions() as own, own.begin():
            return queries.append_audit(own, user, action, model, number, detail).to_record()

    def record_failure(self, model: str, user: str, detail: dict) -> None:
        """Audit a refused registration ('register_failed'); nothing else is written."""
        with self._sessions() as session, session.begin():
            queries.append_audit(session, user, "register_failed", model, None, detail)

    def set_alias(self, model: str, alias: str, number: int, user: str, audit: dict | None = None) -> AliasRecord:
        """Point `model@alias` at version `number`, recording the move in the history and the audit log.

        `audit` adds to the entry's detail (a forced move of a guarded alias names what it overrode)."""
        if not alias or alias.isdigit() or "@" in alias:
            raise RegistryError(
                f"alias {alias!r} is not allowed; use a name that is not a number and has no '@', e.g. 'production'"
            )
        with self._sessions() as session, session.begin():
            model_row = queries.model_row(session, model, lock=True)
            version = queries.version_row(session, model, int(number))
            row = session.get(AliasRow, (model_row.id, alias))
            previous = None if row is None else row.version.number
            at = now()
            if row is None:
                row = AliasRow(model_id=model_row.id, alias=alias, version_id=version.id, moved_at=at, user=user)
                session.add(row)
            else:
                row.version_id, row.moved_at, row.user = version.id, at, user
            session.add(
                AliasHistoryRow(model_id=model_row.id, alias=alias, number=version.number, moved_at=at, user=user)
            )
            session.flush()
            session.refresh(row)
            queries.append_audit(
                session,
                user,
                "alias",
                model,
                version.number,
                {"alias": alias, "from": previous, "to": version.number, **(audit or {})},
            )
            return row.to_record()

    def delete_version(self, model: str, number: int, user: str) -> None:
        """Delete a leaf version (its blob references go with it; gc reclaims the bytes)."""
        with self._sessions() as session, session.begin():
            queries.model_row(session, model, lock=True)
            row = queries.version_row(session, model, int(number))
            children = queries.records(session, VersionRow.parent_id == row.id, order=[VersionRow.id])
            if children:
                raise RegistryError(
                    f"version {model}@{number} has children ({', '.join(c.ref for c in children)}); "
                    "deleting it would orphan their lineage, delete the children first"
                )
            aliases = session.scalars(select(AliasRow.alias).where(AliasRow.version_id == row.id)).all()
            if aliases:
                raise RegistryError(
                    f"version {model}@{number} is the target of alias(es) {', '.join(sorted(aliases))}; "
                    "move the alias(es) to another version first"
                )
            session.query(BlobRefRow).filter(BlobRefRow.version_id == row.id).delete()
            detail = {"digest": row.digest, "content_digest": row.content_digest}
            session.delete(row)
            session.flush()
            queries.append_audit(session, user, "delete", model, int(number), detail)


__all__ = ["MetadataStore"]
