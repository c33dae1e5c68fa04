"""Serving faults of a drift window (schemas.monitoring.ServingFault): one nullable JSON column, drift_windows.faults.

A window whose collector saw the model served wrongly (train mode, statistics changing between windows, a graph
computing batch statistics) or whose statistics digest is not the version's keeps them there (state serving_fault).
Windows stored before this revision have NULL there: no fault was looked for.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("drift_windows", sa.Column("faults", sa.Text, nullable=True))


def downgrade() -> None:
    # In place, as 0010 does: rebuilding drift_windows (SQLite's batch mode) would cascade-delete its layers and arrays.
    op.execute("ALTER TABLE drift_windows DROP COLUMN faults")
