"""API tokens (hashed, with roles and an optional model scope) and recorded drift checks.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("models", sa.JSON, nullable=True),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("note", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("revoked_at", sa.DateTime, nullable=True),
    )
    op.create_table(
        "drift_reports",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "version_id", sa.Integer, sa.ForeignKey("versions.id", name="fk_drift_reports_version"), nullable=False
        ),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("report", sa.JSON, nullable=False),
    )
    op.create_index("ix_drift_reports_version_id", "drift_reports", ["version_id"])


def downgrade() -> None:
    op.drop_index("ix_drift_reports_version_id", table_name="drift_reports")
    op.drop_table("drift_reports")
    op.drop_table("api_tokens")
