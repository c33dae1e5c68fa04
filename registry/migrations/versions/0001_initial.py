"""Initial registry schema: models, versions, blob references, aliases, alias history, audit log.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_APPEND_ONLY_MESSAGE = "audit_log is append-only"


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("last_number", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("name", name="uq_models_name"),
    )
    op.create_table(
        "versions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model_id", sa.Integer, sa.ForeignKey("models.id", name="fk_versions_model"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("content_digest", sa.String(64), nullable=False),
        sa.Column("manifest", sa.JSON, nullable=False),
        sa.Column("parent_id", sa.Integer, sa.ForeignKey("versions.id", name="fk_versions_parent"), nullable=True),
        sa.Column("operation", sa.String(32), nullable=False),
        sa.Column("note", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.UniqueConstraint("model_id", "number", name="uq_versions_model_number"),
        sa.UniqueConstraint("model_id", "content_digest", name="uq_versions_model_content"),
    )
    op.create_index("ix_versions_parent_id", "versions", ["parent_id"])
    op.create_table(
        "version_blobs",
        sa.Column(
            "version_id",
            sa.Integer,
            sa.ForeignKey("versions.id", name="fk_version_blobs_version", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("digest", sa.String(64), primary_key=True),
    )
    op.create_index("ix_version_blobs_digest", "version_blobs", ["digest"])
    op.create_table(
        "aliases",
        sa.Column("model_id", sa.Integer, sa.ForeignKey("models.id", name="fk_aliases_model"), primary_key=True),
        sa.Column("alias", sa.String(255), primary_key=True),
        sa.Column("version_id", sa.Integer, sa.ForeignKey("versions.id", name="fk_aliases_version"), nullable=False),
        sa.Column("moved_at", sa.DateTime, nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
    )
    op.create_table(
        "alias_history",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model_id", sa.Integer, sa.ForeignKey("models.id", name="fk_alias_history_model"), nullable=False),
        sa.Column("alias", sa.String(255), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("moved_at", sa.DateTime, nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
    )
    op.create_index("ix_alias_history_model_alias", "alias_history", ["model_id", "alias"])
    op.create_table(
        "audit_log",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("model", sa.String(255), nullable=True),
        sa.Column("number", sa.Integer, nullable=True),
        sa.Column("detail", sa.JSON, nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.create_index("ix_audit_log_model", "audit_log", ["model"])
    op.create_index("ix_audit_log_user", "audit_log", ["user"])
    locks = op.create_table("registry_locks", sa.Column("name", sa.String(64), primary_key=True))
    op.bulk_insert(locks, [{"name": "audit"}])

    # Append-only in the database itself, not only in the API (the hash chain detects the rest).
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        for event in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER audit_log_no_{event.lower()} BEFORE {event} ON audit_log "
                f"BEGIN SELECT RAISE(ABORT, '{_APPEND_ONLY_MESSAGE}'); END"
            )
    elif dialect == "postgresql":
        op.execute(
            "CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{_APPEND_ONLY_MESSAGE}'; END $$"
        )
        op.execute(
            "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
            "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()"
        )


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_update")
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_delete")
    elif dialect == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log")
        op.execute("DROP FUNCTION IF EXISTS audit_log_append_only()")
    for table in ("registry_locks", "audit_log", "alias_history", "aliases", "version_blobs", "versions", "models"):
        op.drop_table(table)
