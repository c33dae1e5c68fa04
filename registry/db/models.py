"""Declarative rows of the registry, each converting itself to the frozen record callers see.

As in MLflow's `dbmodels`, rows never leave the store: `to_record()` turns one into the
dataclass of registry/entities.py. Times are stored as naive UTC and returned timezone-aware.
The tables are created by registry/migrations (Alembic), never by `create_all`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from registry.entities import AliasRecord, AuditRecord, VersionRecord


def utc(at: datetime) -> datetime:
    """A stored naive-UTC time as an aware one."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


class Base(DeclarativeBase):
    pass


class ModelRow(Base):
    """A model name; `last_number` is the counter versions are numbered from (never reused)."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True, nullable=False)
    last_number: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)


class VersionRow(Base):
    """One immutable version; `parent_id` points at any model's version (lineage)."""

    __tablename__ = "versions"
    __table_args__ = (
        UniqueConstraint("model_id", "number", name="uq_versions_model_number"),
        UniqueConstraint("model_id", "content_digest", name="uq_versions_model_content"),
        Index("ix_versions_parent_id", "parent_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), nullable=False)
    number: Mapped[int] = mapped_column(Integer, nullable=False)
    digest: Mapped[str] = mapped_column(String(64), nullable=False)
    content_digest: Mapped[str] = mapped_column(String(64), nullable=False)
    manifest: Mapped[dict] = mapped_column(JSON, nullable=False)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("versions.id"), nullable=True)
    operation: Mapped[str] = mapped_column(String(32), nullable=False)
    note: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    user: Mapped[str] = mapped_column(String(255), nullable=False)
    # The servable verdict and its hazards (registry/service/servable.py); NULL for versions registered before it
    # existed.
    servable: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    hazards: Mapped[list | None] = mapped_column(JSON, nullable=True)
    # Whether a safe reader accepted the stored structure at registration (registry/service/structure_check.py);
    # NULL before.
    structure_checked: Mapped[bool | None] = mapped_column(Boolean, nullable=True)

    model: Mapped[ModelRow] = relationship(lazy="joined")

    def to_record(self, parent: str | None = None, *, with_manifest: bool = True) -> VersionRecord:
        """The VersionRecord; `parent` ('name@N') is passed in because it lives in another row.

        `with_manifest=False` leaves `manifest` empty (for rows loaded with the column deferred).
        """
        return VersionRecord(
            model=self.model.name,
            number=self.number,
            digest=self.digest,
            content_digest=self.content_digest,
            manifest=self.manifest if with_manifest else {},
            parent=parent,
            operation=self.operation,
            note=self.note,
            created_at=utc(self.created_at),
            user=self.user,
            servable=self.servable,
            hazards=list(self.hazards or []),
            structure_checked=self.structure_checked,
        )


class BlobRefRow(Base):
    """A version's reference to a blob: what gc must keep."""

    __tablename__ = "version_blobs"
    __table_args__ = (Index("ix_version_blobs_digest", "digest"),)

    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id", ondelete="CASCADE"), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)


class AliasRow(Base):
    """Where an alias points now."""

    __tablename__ = "aliases"

    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), primary_key=True)
    alias: Mapped[str] = mapped_column(String(255), primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"), nullable=False)
    moved_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    user: Mapped[str] = mapped_column(String(255), nullable=False)

    model: Mapped[ModelRow] = relationship(lazy="joined")
    version: Mapped[VersionRow] = relationship(lazy="joined")

    def to_record(self) -> AliasRecord:
        return AliasRecord(
            model=self.model.name,
            alias=self.alias,
            number=self.version.number,
            moved_at=utc(self.moved_at),
            user=self.user,
        )


class AliasHistoryRow(Base):
    """Every move of every alias, oldest first by id."""

    __tablename__ = "alias_history"
    __table_args__ = (Index("ix_alias_history_model_alias", "model_id", "alias"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), nullable=False)
    alias: Mapped[str] = mapped_column(String(255), nullable=False)
    number: Mapped[int] = mapped_column(Integer, nullable=False)
    moved_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    user: Mapped[str] = mapped_column(String(255), nullable=False)

    model: Mapped[ModelRow] = relationship(lazy="joined")

    def to_record(self) -> AliasRecord:
        return AliasRecord(
            model=self.model.name, alias=self.alias, number=self.number, moved_at=utc(self.moved_at), user=self.user
        )


class AuditRow(Base):
    """One append-only audit entry; `seq` is assigned under the audit lock, so it is the chain order."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_model", "model"), Index("ix_audit_log_user", "user"))

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    user: Mapped[str] = mapped_column(String(255), nullable=False)
    action: Mapped[str] = mapped_column(String(64), nullable=False)
    model: Mapped[str | None] = mapped_column(String(255), nullable=True)
    number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    detail: Mapped[dict] = mapped_column(JSON, nullable=False)
    prev_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    hash: Mapped[str] = mapped_column(String(64), nullable=False)

    def to_record(self) -> AuditRecord:
        return AuditRecord(
            seq=self.seq,
            at=utc(self.at),
            user=self.user,
            action=self.action,
            model=self.model,
            number=self.number,
            detail=self.detail,
            prev_hash=self.prev_hash,
            hash=self.hash,
        )


class TokenRow(Base):
    """An API token: only the sha256 of its secret is kept; `models` (None = all) scopes what it may touch."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255), nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    models: Mapped[list | None] = mapped_column(JSON, nullable=True)
    secret_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    note: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    created_by: Mapped[str] = mapped_column(String(255), nullable=False)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)  # None: never (migration 0011)


class DriftReportRow(Base):
    """One recorded drift check of a version (the JSON of converters.models.monitoring.drift's report)."""

    __tablename__ = "drift_reports"
    __table_args__ = (Index("ix_drift_reports_version_id", "version_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    user: Mapped[str] = mapped_column(String(255), nullable=False)
    report: Mapped[dict] = mapped_column(JSON, nullable=False)


class LockRow(Base):
    """Named rows taken FOR UPDATE to serialise writers portably ('audit' orders the hash chain)."""

    __tablename__ = "registry_locks"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)


class BlobLeaseRow(Base):
    """A digest a registration in flight relies on; gc keeps it until the lease ends (registry/blob_leases.py)."""

    __tablename__ = "blob_leases"
    __table_args__ = (Index("ix_blob_leases_digest", "digest"),)

    lease: Mapped[str] = mapped_column(String(32), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    taken_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)


class AuditHeadRow(Base):
    """The one row (id 1) naming the audit log's last entry, moved with every append: cutting the log's end shows."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(Integer, nullable=False)
    hash: Mapped[str] = mapped_column(String(64), nullable=False)
