"""Each stored drift layer's status (registry/drift_status.py): ok, drift or unconverged_statistics, and the share of
initial values judged left in the version's running statistics.

Layers stored before this revision were judged on the thresholds alone: they read `drift` where they were over and
`ok` elsewhere, as the rule counted them then.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("drift_layers", sa.Column("status", sa.String(24), nullable=False, server_default="ok"))
    op.add_column("drift_layers", sa.Column("initial_weight", sa.Float, nullable=True))
    layers = sa.table("drift_layers", sa.column("over", sa.Boolean), sa.column("status", sa.String))
    op.execute(layers.update().where(layers.c.over == sa.true()).values(status="drift"))


def downgrade() -> None:
    with op.batch_alter_table("drift_layers") as batch:  # SQLite drops columns by rebuilding the table
        batch.drop_column("initial_weight")
        batch.drop_column("status")
