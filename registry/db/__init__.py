"""SQLAlchemy models of the registry's metadata (the schema itself is created only by Alembic)."""

from registry.db.models import (
    AliasHistoryRow,
    AliasRow,
    AuditRow,
    Base,
    BlobRefRow,
    LockRow,
    ModelRow,
    VersionRow,
)

__all__ = ["AliasHistoryRow", "AliasRow", "AuditRow", "Base", "BlobRefRow", "LockRow", "ModelRow", "VersionRow"]
