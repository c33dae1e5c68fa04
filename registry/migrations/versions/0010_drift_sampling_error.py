"""Each stored drift layer's sampling error: the batches its window pooled and how far beyond its standard errors its
shift and log variance ratio went (converters/models/monitoring/sampling_error.py), which is what `over` now means.

Layers stored before this revision have none (NULL): they were judged on the thresholds alone, and read as they were.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

COLUMNS = (
    ("batches", sa.BigInteger),
    ("shift_bound", sa.Float),
    ("log_ratio_bound", sa.Float),
    ("error_multiplier", sa.Float),
)


def upgrade() -> None:
    for name, kind in COLUMNS:
        op.add_column("drift_layers", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    # In place, as 0009 drops its column: SQLite 3.35+ and PostgreSQL drop a column without rebuilding the table.
    for name, _ in reversed(COLUMNS):
        op.execute(f"ALTER TABLE drift_layers DROP COLUMN {name}")
