"""SQLAlchemy models of the registry's metadata (the schema itself is created only by Alembic)."""

from registry.db.models import (
    AliasHistoryRow,
    AliasRow,
    AuditHeadRow,
    AuditRow,
    Base,
    BlobLeaseRow,
    BlobRefRow,
    LockRow,
    ModelRow,
    VersionRow,
)

__all__ = [
    "AliasHistoryRow",
    "AliasRow",
    "AuditHeadRow",
    "AuditRow",
    "Base",
    "BlobLeaseRow",
    "BlobRefRow",
    "LockRow",
    "ModelRow",
    "VersionRow",
]
