"""The servable verdict of each version: whether it may serve, and the hazards that say why
(registry/service/servable.py).

Two nullable columns on versions: `servable` (the verdict) and `hazards` (JSON, the warning- and error-level hazards
found at registration). Versions registered before this revision keep NULL there: the registry assesses them when they
are read (from their stored specs), so an old version in train mode is not taken for servable.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("versions", sa.Column("servable", sa.Boolean, nullable=True))
    op.add_column("versions", sa.Column("hazards", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("versions") as batch:  # SQLite drops columns by rebuilding the table
        batch.drop_column("hazards")
        batch.drop_column("servable")
