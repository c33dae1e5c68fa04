"""Blob leases (gc never deletes a blob a registration relies on) and the audit log's head, anchored outside the chain.

blob_leases: the digests each registration in flight relies on (registry/blob_leases.py), with the 'blobs' row of
registry_locks that gc takes exclusively and registrations take shared. audit_head: one row, the last entry's seq and
hash, moved in the same transaction as every append, so deleting the end of the log no longer leaves a chain that
verifies. An existing registry gets the head of its chain as it is at the upgrade. Like audit_log, audit_head is
guarded by triggers: it cannot be deleted, and it only moves to the entry just appended.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

#: What an empty chain starts from (registry.audit_chain.GENESIS, frozen here as migrations are).
_GENESIS = "0" * 64
_HEAD_MESSAGE = "audit_head only moves to the audit entry just appended"


def upgrade() -> None:
    op.create_table(
        "blob_leases",
        sa.Column("lease", sa.String(32), primary_key=True),
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("taken_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_blob_leases_digest", "blob_leases", ["digest"])
    op.bulk_insert(sa.table("registry_locks", sa.column("name", sa.String)), [{"name": "blobs"}])

    head = op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.CheckConstraint("id = 1", name="ck_audit_head_one_row"),
    )
    last = op.get_bind().execute(sa.text("SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1")).first()
    op.bulk_insert(
        head, [{"id": 1, "seq": 0 if last is None else last.seq, "hash": _GENESIS if last is None else last.hash}]
    )
    _guard_head()


def _guard_head() -> None:
    """The head row is never deleted and moves one entry forward, onto the audit row appended in its transaction."""
    moves_wrongly = (
        "NEW.id <> OLD.id OR NEW.seq <> OLD.seq + 1 OR "
        "NEW.hash IS DISTINCT FROM (SELECT hash FROM audit_log WHERE seq = NEW.seq)"
    )
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute(
            f"CREATE TRIGGER audit_head_no_delete BEFORE DELETE ON audit_head BEGIN SELECT RAISE(ABORT, '{_HEAD_MESSAGE}'); END"
        )
        op.execute(
            f"CREATE TRIGGER audit_head_forward BEFORE UPDATE ON audit_head "
            f"WHEN {moves_wrongly.replace('IS DISTINCT FROM', 'IS NOT')} BEGIN SELECT RAISE(ABORT, '{_HEAD_MESSAGE}'); END"
        )
    elif dialect == "postgresql":
        op.execute(
            "CREATE FUNCTION audit_head_forward() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF TG_OP = 'DELETE' OR {moves_wrongly} THEN RAISE EXCEPTION '{_HEAD_MESSAGE}'; END IF; "
            "RETURN NEW; END $$"
        )
        op.execute(
            "CREATE TRIGGER audit_head_forward BEFORE UPDATE OR DELETE ON audit_head "
            "FOR EACH ROW EXECUTE FUNCTION audit_head_forward()"
        )


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS audit_head_no_delete")
        op.execute("DROP TRIGGER IF EXISTS audit_head_forward")
    elif dialect == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_head_forward ON audit_head")
        op.execute("DROP FUNCTION IF EXISTS audit_head_forward()")
    op.drop_table("audit_head")
    op.execute("DELETE FROM registry_locks WHERE name = 'blobs'")
    op.drop_index("ix_blob_leases_digest", table_name="blob_leases")
    op.drop_table("blob_leases")
