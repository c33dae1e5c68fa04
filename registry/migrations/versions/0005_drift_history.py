"""The drift history: windows shipped by serving collectors, their per-layer summaries, per-channel arrays and each
version's incremental alert state (registry/db/drift_rows.py, registry/drift_history.py).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "drift_windows",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "version_id", sa.Integer, sa.ForeignKey("versions.id", name="fk_drift_windows_version"), nullable=False
        ),
        sa.Column("received_at", sa.DateTime, nullable=False),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("ended_at", sa.DateTime, nullable=False),
        sa.Column("replica", sa.String(255), nullable=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("requests", sa.Integer, nullable=False),
        sa.Column("sampled", sa.Integer, nullable=False),
        sa.Column("dropped", sa.Integer, nullable=False),
        sa.Column("statistics_digest", sa.String(64), nullable=True),
        sa.Column("over", sa.Boolean, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("unmatched", sa.String(4096), nullable=True),
    )
    op.create_index("ix_drift_windows_version_id", "drift_windows", ["version_id", "id"])
    op.create_index("ix_drift_windows_received_at", "drift_windows", ["received_at"])
    op.create_table(
        "drift_layers",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "window_id",
            sa.Integer,
            sa.ForeignKey("drift_windows.id", name="fk_drift_layers_window", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("layer", sa.String(512), nullable=False),
        sa.Column("channels", sa.Integer, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("max_shift", sa.Float, nullable=False),
        sa.Column("mean_shift", sa.Float, nullable=False),
        sa.Column("worst_shift_channel", sa.Integer, nullable=False),
        sa.Column("variance_ratio", sa.Float, nullable=False),
        sa.Column("max_abs_log_ratio", sa.Float, nullable=False),
        sa.Column("over", sa.Boolean, nullable=False),
    )
    op.create_index("ix_drift_layers_window_id", "drift_layers", ["window_id"])
    op.create_table(
        "drift_window_arrays",
        sa.Column(
            "window_id",
            sa.Integer,
            sa.ForeignKey("drift_windows.id", name="fk_drift_arrays_window", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "drift_state",
        sa.Column(
            "version_id", sa.Integer, sa.ForeignKey("versions.id", name="fk_drift_state_version"), primary_key=True
        ),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("recent", sa.String(64), nullable=False),
        sa.Column("windows", sa.Integer, nullable=False),
        sa.Column("last_window_id", sa.Integer, nullable=True),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("drift_state")
    op.drop_table("drift_window_arrays")
    op.drop_index("ix_drift_layers_window_id", table_name="drift_layers")
    op.drop_table("drift_layers")
    op.drop_index("ix_drift_windows_received_at", table_name="drift_windows")
    op.drop_index("ix_drift_windows_version_id", table_name="drift_windows")
    op.drop_table("drift_windows")
