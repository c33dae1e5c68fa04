"""Whether a version's stored structure was checked at registration (registry/service/structure_check.py).

One nullable column on versions, `structure_checked`: true when a safe reader accepted the structure at registration
(the registered file's own reader, or the structure rebuilt and read back), so `pull` writes the file without reading
it back. Versions registered before this revision keep NULL there, and `pull` reads their files back as before.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("versions", sa.Column("structure_checked", sa.Boolean, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("versions") as batch:  # SQLite drops columns by rebuilding the table
        batch.drop_column("structure_checked")
