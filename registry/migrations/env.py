"""Alembic environment of the registry: runs on the connection MetadataStore hands over.

`config.attributes["connection"]` carries an open SQLAlchemy connection (MetadataStore);
otherwise the URL comes from `-x url=...` or `sqlalchemy.url` (alembic on the command line).
On PostgreSQL an advisory lock serialises concurrent first openings of one database, so eight
processes opening a fresh registry at once do not all try to create the tables; on SQLite the one
transaction holding every migration does (its BEGIN IMMEDIATE takes the write lock).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from registry.db import drift_rows  # noqa: F401  (its tables join Base.metadata)
from registry.db.models import Base
from registry.db.engine import make_engine

#: pg_advisory_xact_lock key of schema migrations (any constant shared by all processes).
MIGRATION_LOCK_KEY = 7_262_401_845

config = context.config
target_metadata = Base.metadata


def _migrate(connection) -> None:
    # transactional_ddl: every migration in ONE transaction, on SQLite too (Alembic's SQLite default commits after each
    # migration, so a process that read the version between two of another's commits ran a migration again: "duplicate
    # column"). SQLite's transaction BEGINs IMMEDIATE (registry/db/engine.py):
    # concurrent first openings queue behind it.
    context.configure(
        connection=connection, target_metadata=target_metadata, render_as_batch=True, transactional_ddl=True
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        context.run_migrations()


def run_migrations_offline() -> None:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            _migrate(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
