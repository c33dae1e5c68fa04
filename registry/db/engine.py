"""Engines for the registry database: one SQLAlchemy URL, SQLite by default, PostgreSQL tested.

SQLite gets a busy timeout, WAL and BEGIN IMMEDIATE writers (so two registrations never read the
same version counter); sessions marked READ_ONLY begin deferred and never queue behind a writer.
The schema is created and upgraded only by Alembic (registry/migrations), never by `create_all`;
a database already at the newest migration is recognised without importing Alembic (`at_head`: a
cold CLI process would otherwise spend a third of a second loading it to find nothing to do).
"""

from __future__ import annotations

import importlib.util
import re
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Engine, make_url

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"

#: Execution option marking the sessions that only read (SQLite then BEGINs without the write lock).
READ_ONLY = "normbridge_read_only"

#: How long a SQLite writer waits for the lock before failing (seconds).
SQLITE_BUSY_TIMEOUT = 60.0


def now() -> datetime:
    """Naive UTC with microseconds: what every DateTime column stores."""
    return datetime.now(UTC).replace(tzinfo=None)


def alembic_config(connection=None):
    """Alembic configured from code, so the migrations are found wherever the package is installed."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


_REVISION = re.compile(r'^(down_revision|revision) = (None|"([^"]+)")$', re.MULTILINE)


@cache
def head_revision() -> str:
    """The newest migration's revision id, read from the migration files' `revision = "..."` lines (the one no other
    migration names as its down_revision); the migrations test checks it is Alembic's own head."""
    downs, revisions = set(), set()
    for path in (MIGRATIONS / "versions").glob("*.py"):
        found = {name: value for name, _, value in _REVISION.findall(path.read_text())}
        revisions.add(found["revision"])
        downs.add(found["down_revision"] or None)
    heads = revisions - downs
    if len(heads) != 1:
        raise RuntimeError(f"the migrations in {MIGRATIONS / 'versions'} have heads {sorted(heads)}; exactly one expected")
    return heads.pop()


def at_head(engine: Engine) -> bool:
    """Whether the database's schema is at the newest migration (False for an empty database or any doubt: Alembic decides)."""
    try:
        with engine.connect().execution_options(**{READ_ONLY: True}) as connection:
            versions = [row[0] for row in connection.execute(text("SELECT version_num FROM alembic_version"))]
            connection.rollback()
    except Exception:  # no table yet, or a database that cannot say: the upgrade finds out
        return False
    return versions == [head_revision()]


def normalize_url(url: str | URL) -> URL:
    """`url` with a PostgreSQL driver that is installed.

    SQLAlchemy 2.1 maps a bare 'postgresql://' to psycopg 3; when only psycopg2 is installed
    we use it instead of failing on an import the user never asked for.
    """
    parsed = make_url(url)
    if (
        parsed.drivername == "postgresql"
        and importlib.util.find_spec("psycopg") is None
        and importlib.util.find_spec("psycopg2") is not None
    ):
        parsed = parsed.set(drivername="postgresql+psycopg2")
    return parsed


def make_engine(url: str | URL) -> Engine:
    """An engine for `url`; SQLite gets a busy timeout, WAL and BEGIN IMMEDIATE transactions."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True)
    database = parsed.database
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # Let SQLAlchemy, not the driver, emit BEGIN (the pysqlite recipe in the SQLAlchemy docs).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT * 1000)}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if database and database != ":memory:":
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        # IMMEDIATE takes the write lock at BEGIN, so two writers never both read the same counter;
        # read-only sessions (READ_ONLY option) BEGIN deferred and never queue behind a writer.
        connection.exec_driver_sql("BEGIN" if connection.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")

    return engine


__all__ = ["MIGRATIONS", "READ_ONLY", "SQLITE_BUSY_TIMEOUT", "alembic_config", "at_head", "head_revision", "make_engine", "normalize_url", "now"]
