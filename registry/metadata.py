"""The registry's metadata store: versions, lineage, aliases and the audit log in any SQL database.

One SQLAlchemy URL selects the database (SQLite by default, PostgreSQL tested); the schema is
created and upgraded only by Alembic (registry/migrations), never by `create_all`. Every write
is one transaction. Version numbers come from a per-model counter read under a lock (the model
row FOR UPDATE on PostgreSQL; SQLite serialises writers with BEGIN IMMEDIATE), so concurrent
registrations get consecutive numbers; the audit log is a hash chain appended under a second,
global lock (the 'audit' row of registry_locks), always taken last. Each append continues from
the chain's head (table audit_head) and moves it in the same transaction, so entries deleted from
the log's end leave a head that no longer matches (registry/audit_chain.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event, func, literal, select, text, union, update
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.orm import Session, aliased, defer, sessionmaker

from registry.audit_chain import AuditCheck, AuditHead, check_head, entry_hash, entry_payload, verify_chain
from registry.db.models import (
    AliasHistoryRow,
    AliasRow,
    AuditHeadRow,
    AuditRow,
    BlobRefRow,
    LockRow,
    ModelRow,
    VersionRow,
)
from schemas.errors import IntegrityError, NotFoundError, RegistryError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"

#: Execution option marking the sessions that only read (SQLite then BEGINs without the write lock).
READ_ONLY = "normbridge_read_only"

#: How long a SQLite writer waits for the lock before failing (seconds).
SQLITE_BUSY_TIMEOUT = 60.0


@dataclass(frozen=True)
class VersionRecord:
    model: str
    number: int
    digest: str
    content_digest: str
    manifest: dict
    parent: str | None  # "name@N"
    operation: str
    note: str | None
    created_at: datetime
    user: str

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.number}"


@dataclass(frozen=True)
class AliasRecord:
    model: str
    alias: str
    number: int
    moved_at: datetime
    user: str


@dataclass(frozen=True)
class AuditRecord:
    seq: int
    at: datetime
    user: str
    action: str
    model: str | None
    number: int | None
    detail: dict
    prev_hash: str
    hash: str


def _now() -> datetime:
    """Naive UTC with microseconds: what every DateTime column stores."""
    return datetime.now(UTC).replace(tzinfo=None)


def alembic_config(connection=None) -> Config:
    """Alembic configured from code, so the migrations are found wherever the package is installed."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def normalize_url(url: str | URL) -> URL:
    """`url` with a PostgreSQL driver that is installed.

    SQLAlchemy 2.1 maps a bare 'postgresql://' to psycopg 3; when only psycopg2 is installed
    we use it instead of failing on an import the user never asked for.
    """
    parsed = make_url(url)
    if (
        parsed.drivername == "postgresql"
        and importlib.util.find_spec("psycopg") is None
        and importlib.util.find_spec("psycopg2") is not None
    ):
        parsed = parsed.set(drivername="postgresql+psycopg2")
    return parsed


def make_engine(url: str | URL) -> Engine:
    """An engine for `url`; SQLite gets a busy timeout, WAL and BEGIN IMMEDIATE transactions."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True)
    database = parsed.database
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # Let SQLAlchemy, not the driver, emit BEGIN (the pysqlite recipe in the SQLAlchemy docs).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT * 1000)}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if database and database != ":memory:":
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        # IMMEDIATE takes the write lock at BEGIN, so two writers never both read the same counter;
        # read-only sessions (READ_ONLY option) BEGIN deferred and never queue behind a writer.
        connection.exec_driver_sql("BEGIN" if connection.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")

    return engine


#: The parent version and its model, joined onto every version query (built once: aliased() is costly per request).
_PARENT = aliased(VersionRow)
_OTHER = aliased(VersionRow)  # a model's versions in a subquery (the newest number)
_PARENT_MODEL = aliased(ModelRow)


def split_ref(ref: str) -> tuple[str, str | None]:
    """'name@N' / 'name@alias' / 'name' -> (name, suffix or None)."""
    name, at, suffix = ref.rpartition("@")
    if not at:
        return ref, None
    if not name or not suffix:
        raise RegistryError(f"reference {ref!r} is malformed; expected 'NAME', 'NAME@N' or 'NAME@ALIAS'")
    return name, suffix


class MetadataStore:
    """Versions, lineage, aliases and the audit chain of one registry database."""

    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._read_sessions = sessionmaker(self.engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False)
        # One snapshot for reads that must agree with each other (the audit log and its head): a SQLite read
        # transaction already is one; PostgreSQL's default READ COMMITTED takes a new snapshot per statement.
        snapshot = {"isolation_level": "REPEATABLE READ"} if self.engine.dialect.name == "postgresql" else {}
        self._snapshot_sessions = sessionmaker(self.engine.execution_options(**{READ_ONLY: True}, **snapshot), expire_on_commit=False)
        self.upgrade()

    def __repr__(self) -> str:
        return f"MetadataStore({make_url(self.url).render_as_string(hide_password=True)!r})"

    def close(self) -> None:
        self.engine.dispose()

    def upgrade(self) -> None:
        """Apply every pending Alembic migration (upgrade head)."""
        with self.engine.connect() as connection:
            command.upgrade(alembic_config(connection), "head")
            connection.commit()

    # ---------------------------------------------------------------- helpers

    def _model(self, session: Session, name: str, *, lock: bool = False) -> ModelRow:
        query = select(ModelRow).where(ModelRow.name == name)
        if lock:
            query = query.with_for_update()
        row = session.scalars(query).one_or_none()
        if row is None:
            known = session.scalars(select(ModelRow.name).order_by(ModelRow.name).limit(20)).all()
            listing = ", ".join(known) if known else "none yet"
            raise NotFoundError(
                f"model {name!r} is not in the registry (registered models: {listing}); "
                "check the name or register it first"
            )
        return row

    def _version_row(self, session: Session, model: str, number: int, model_row: ModelRow | None = None) -> VersionRow:
        model_row = model_row or self._model(session, model)
        row = session.scalars(
            select(VersionRow).where(VersionRow.model_id == model_row.id, VersionRow.number == number)
        ).one_or_none()
        if row is None:
            numbers = session.scalars(
                select(VersionRow.number).where(VersionRow.model_id == model_row.id).order_by(VersionRow.number)
            ).all()
            raise NotFoundError(
                f"version {model}@{number} does not exist; {model} has versions "
                f"{_ranges(numbers) if numbers else 'none'}"
            )
        return row

    def _records(self, session: Session, condition, order=None) -> list[VersionRecord]:
        """VersionRecords of the rows matching `condition`, with their parents' 'name@N' in one query."""
        return [record for _, record in self._records_by_id(session, condition, order)]

    def _records_by_id(
        self, session: Session, condition, order=None, *, manifests: bool = True
    ) -> list[tuple[int, VersionRecord]]:
        parent, parent_model = _PARENT, _PARENT_MODEL
        query = (
            select(VersionRow, parent_model.name, parent.number)
            .outerjoin(parent, VersionRow.parent_id == parent.id)
            .outerjoin(parent_model, parent.model_id == parent_model.id)
            .where(condition)
        )
        if order is not None:
            query = query.order_by(*order)
        if not manifests:
            query = query.options(defer(VersionRow.manifest, raiseload=True))
        return [
            (row.id, row.to_record(None if pname is None else f"{pname}@{pnumber}", with_manifest=manifests))
            for row, pname, pnumber in session.execute(query).all()
        ]

    def _record(self, session: Session, row: VersionRow) -> VersionRecord:
        return self._records(session, VersionRow.id == row.id)[0]

    def _append_audit(
        self, session: Session, user: str, action: str, model: str | None, number: int | None, detail: dict
    ) -> AuditRow:
        """Append one chained entry after the head and move the head onto it; takes the global audit lock (always the
        last lock a writer takes). Continuing from the head, not from the last row, keeps a cut visible for good: the
        next entry then chains to an entry that is no longer there."""
        session.scalars(select(LockRow).where(LockRow.name == "audit").with_for_update()).one()
        head = session.execute(select(AuditHeadRow.seq, AuditHeadRow.hash).where(AuditHeadRow.id == 1)).first()
        if head is None:
            raise IntegrityError("the audit head (table audit_head) is missing, so nothing more is appended to the audit log; "
                                 "restore the database from a backup")
        seq, prev_hash = head.seq + 1, head.hash
        at = _now()
        # Hash exactly what the database will give back: JSON types only (tuples become lists, paths strings).
        detail = json.loads(json.dumps(dict(detail), default=str))
        payload = entry_payload(seq, at, user, action, model, number, detail)
        row = AuditRow(
            seq=seq,
            at=at,
            user=user,
            action=action,
            model=model,
            number=number,
            detail=detail,
            prev_hash=prev_hash,
            hash=entry_hash(prev_hash, payload),
        )
        session.add(row)
        session.flush()
        session.execute(update(AuditHeadRow).where(AuditHeadRow.id == 1).values(seq=seq, hash=row.hash))
        return row

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
    ) -> tuple[VersionRecord, bool]:
        """Register a version in one transaction; identical content returns the existing version.

        `guard(session)` runs first inside that transaction and may refuse: the registry ends the registration's blob
        lease there (registry/blob_leases.py), atomically with the blob references that replace it.
        """
        if not model or "@" in model:
            raise RegistryError(f"model name {model!r} is not allowed; use a non-empty name without '@'")
        with self._sessions() as session, session.begin():
            model_row = self._lock_or_create_model(session, model)
            if guard is not None:
                guard(session)
            existing = session.scalars(
                select(VersionRow).where(
                    VersionRow.model_id == model_row.id, VersionRow.content_digest == content_digest
                )
            ).one_or_none()
            if existing is not None:
                self._append_audit(
                    session,
                    user,
                    "register_existing",
                    model,
                    existing.number,
                    {"digest": digest, "content_digest": content_digest, "existing_digest": existing.digest},
                )
                return self._record(session, existing), False
            parent_id = None
            if parent is not None:
                parent_id = self._version_row(session, parent[0], int(parent[1])).id
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
                created_at=_now(),
                user=user,
            )
            session.add(row)
            session.flush()
            session.add_all(BlobRefRow(version_id=row.id, digest=blob) for blob in sorted(set(blob_digests)))
            detail = {"digest": digest, "content_digest": content_digest, "operation": operation}
            if parent is not None:
                detail["parent"] = f"{parent[0]}@{int(parent[1])}"
            self._append_audit(session, user, "register", model, row.number, detail)
            return self._record(session, row), True

    def _lock_or_create_model(self, session: Session, model: str) -> ModelRow:
        """The model row, locked FOR UPDATE (created first if needed, race-free via ON CONFLICT DO NOTHING)."""
        dialect = session.get_bind().dialect.name
        values = {"name": model, "last_number": 0, "created_at": _now()}
        if dialect in ("postgresql", "sqlite"):
            module = __import__(f"sqlalchemy.dialects.{dialect}", fromlist=["insert"])
            session.execute(module.insert(ModelRow).values(**values).on_conflict_do_nothing(index_elements=["name"]))
        elif session.scalars(select(ModelRow.id).where(ModelRow.name == model)).one_or_none() is None:
            session.add(ModelRow(**values))
            session.flush()
        return self._model(session, model, lock=True)

    def append_audit(self, action: str, model: str | None, number: int | None, detail: dict, user: str,
                     session: Session | None = None) -> AuditRecord:
        """Append one chained entry for a write that is not a version (gc, token create/revoke).

        Pass `session` (inside its open transaction) to make the entry atomic with that write.
        """
        if session is not None:
            return self._append_audit(session, user, action, model, number, detail).to_record()
        with self._sessions() as own, own.begin():
            return self._append_audit(own, user, action, model, number, detail).to_record()

    def record_failure(self, model: str, user: str, detail: dict) -> None:
        """Audit a refused registration ('register_failed'); nothing else is written."""
        with self._sessions() as session, session.begin():
            self._append_audit(session, user, "register_failed", model, None, detail)

    def set_alias(self, model: str, alias: str, number: int, user: str) -> AliasRecord:
        """Point `model@alias` at version `number`, recording the move in the history and the audit log."""
        if not alias or alias.isdigit() or "@" in alias:
            raise RegistryError(
                f"alias {alias!r} is not allowed; use a name that is not a number and has no '@', e.g. 'production'"
            )
        with self._sessions() as session, session.begin():
            model_row = self._model(session, model, lock=True)
            version = self._version_row(session, model, int(number))
            row = session.get(AliasRow, (model_row.id, alias))
            previous = None if row is None else row.version.number
            at = _now()
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
            self._append_audit(
                session, user, "alias", model, version.number, {"alias": alias, "from": previous, "to": version.number}
            )
            return row.to_record()

    def delete_version(self, model: str, number: int, user: str) -> None:
        """Delete a leaf version (its blob references go with it; gc reclaims the bytes)."""
        with self._sessions() as session, session.begin():
            self._model(session, model, lock=True)
            row = self._version_row(session, model, int(number))
            children = self._records(session, VersionRow.parent_id == row.id, order=[VersionRow.id])
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
            self._append_audit(session, user, "delete", model, int(number), detail)

    # ---------------------------------------------------------------- reads

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
            model_row = self._model(session, model)
            return self._records(session, VersionRow.model_id == model_row.id, order=[VersionRow.number])

    def version(self, model: str, number: int) -> VersionRecord:
        with self._read_sessions() as session:
            return self._record(session, self._version_row(session, model, int(number)))

    def resolve(self, ref: str) -> VersionRecord:
        """'name@N', 'name@alias' or 'name' (its latest version)."""
        name, suffix = split_ref(ref)
        with self._read_sessions() as session:
            model_row = self._model(session, name)
            if suffix is None:
                newest = select(func.max(_OTHER.number)).where(_OTHER.model_id == model_row.id).scalar_subquery()
                found = self._records(session, (VersionRow.model_id == model_row.id) & (VersionRow.number == newest))
                if not found:
                    raise NotFoundError(f"model {name!r} has no versions left; register one first")
                return found[0]
            if suffix.isdigit():
                # one query with the parent joined in; only a missing version pays for the message listing the others
                found = self._records(session, (VersionRow.model_id == model_row.id) & (VersionRow.number == int(suffix)))
                return found[0] if found else self._record(session, self._version_row(session, name, int(suffix), model_row))
            alias = session.get(AliasRow, (model_row.id, suffix))
            if alias is None:
                known = session.scalars(
                    select(AliasRow.alias).where(AliasRow.model_id == model_row.id).order_by(AliasRow.alias)
                ).all()
                raise NotFoundError(
                    f"{name} has no alias {suffix!r}; its aliases are {', '.join(known) if known else 'none'} "
                    f"(use NAME@N for a version number)"
                )
            return self._record(session, alias.version)

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
            start = self._version_row(session, model, int(number))
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
                by_id.update(self._records_by_id(session, part, manifests=manifests))
            ancestors = [by_id[i] for i in sorted(ancestor_depth, key=ancestor_depth.__getitem__)]
            descendants = [by_id[i] for i in sorted(descendant_depth, key=lambda i: (descendant_depth[i], i))]
            return ancestors, descendants

    def aliases(self, model: str) -> list[AliasRecord]:
        with self._read_sessions() as session:
            model_row = self._model(session, model)
            rows = session.scalars(select(AliasRow).where(AliasRow.model_id == model_row.id).order_by(AliasRow.alias))
            return [row.to_record() for row in rows]

    def alias_history(self, model: str, alias: str) -> list[AliasRecord]:
        """Every move of `model@alias`, oldest first."""
        with self._read_sessions() as session:
            model_row = self._model(session, model)
            rows = session.scalars(
                select(AliasHistoryRow)
                .where(AliasHistoryRow.model_id == model_row.id, AliasHistoryRow.alias == alias)
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
                chunk = wanted[start:start + 500]
                by_blob = select(BlobRefRow.digest, ModelRow.name).join(VersionRow, BlobRefRow.version_id == VersionRow.id).join(
                    ModelRow, VersionRow.model_id == ModelRow.id).where(BlobRefRow.digest.in_(chunk))
                by_version = select(VersionRow.digest, ModelRow.name).join(ModelRow, VersionRow.model_id == ModelRow.id).where(
                    VersionRow.digest.in_(chunk))
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
        return entries, AuditCheck(problems=verify_chain(entries) + check_head(entries, head, pinned_head), head=head, entries=len(entries))


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5' (short enough for an error message)."""
    parts: list[str] = []
    start = prev = None
    for n in numbers:
        if start is None:
            start = prev = n
        elif n == prev + 1:
            prev = n
        else:
            parts.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = n
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ", ".join(parts)


def default_sqlite_url(folder: str | os.PathLike) -> str:
    """The embedded default: a SQLite file 'registry.db' in `folder`."""
    return f"sqlite:///{Path(folder).expanduser().resolve() / 'registry.db'}"
