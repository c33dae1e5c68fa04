"""Drift windows: a content digest, so that a window posted twice counts once, and counts of 64 bits.

`drift_windows.content_digest` is the sha256 of a window's canonical content (registry/drift_history.window_digest),
unique per version: a window posted again (a retry, a replay) finds the stored one and is not stored or counted a
second time. Windows stored before this revision have none (NULL, which the unique index lets repeat).

`requests`, `sampled` and `dropped` (drift_windows) and `count` (drift_layers) become BIGINT on PostgreSQL, whose
INTEGER stops at 2^31 - 1, below what a window may carry (schemas.monitoring.MAX_COUNT, 2^63 - 1). SQLite's INTEGER
already holds 64 bits; its columns stay as they are. The downgrade narrows them again, which fails on a stored value
over 2^31 - 1.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

WIDENED = (
    ("drift_windows", "requests"),
    ("drift_windows", "sampled"),
    ("drift_windows", "dropped"),
    ("drift_layers", "count"),
)


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def upgrade() -> None:
    op.add_column("drift_windows", sa.Column("content_digest", sa.String(64), nullable=True))
    op.create_index("ux_drift_windows_content", "drift_windows", ["version_id", "content_digest"], unique=True)
    if not _sqlite():
        for table, column in WIDENED:
            op.alter_column(table, column, type_=sa.BigInteger, existing_type=sa.Integer, existing_nullable=False)


def downgrade() -> None:
    if not _sqlite():
        for table, column in WIDENED:
            op.alter_column(table, column, type_=sa.Integer, existing_type=sa.BigInteger, existing_nullable=False)
    op.drop_index("ux_drift_windows_content", table_name="drift_windows")
    # Not a batch rebuild: with foreign keys on, dropping the old drift_windows would cascade to every window's layers
    # and arrays. SQLite (3.35+) drops a column in place, as PostgreSQL does.
    op.execute("ALTER TABLE drift_windows DROP COLUMN content_digest")
