"""API tokens expire (registry/tokens.py): one nullable column on api_tokens, `expires_at`.

New tokens get one (90 days unless `normbridge token create --expires` says otherwise); tokens created before this
revision keep NULL there, which means they never expire, as before.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:  # SQLite drops columns by rebuilding the table
        batch.drop_column("expires_at")
