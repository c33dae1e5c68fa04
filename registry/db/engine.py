"""Engines for the registry database: one SQLAlchemy URL, SQLite by default, PostgreSQL tested.

SQLite gets a busy timeout, WAL and BEGIN IMMEDIATE writers (so two registrations never read the
same version counter); sessions marked READ_ONLY begin deferred and never queue behind a writer.
The schema is created and upgraded only by Alembic (registry/migrations), never by `create_all`;
a database already at the newest migration is recognised without importing Alembic (`at_head`: a
cold CLI process would otherwise spend a third of a second loading it to find nothing to do).
A new SQLite database file is created private to its owner (or shared with its folder's group: registry/file_modes.py),
and a database whose disk is full is a StorageFullError naming it, never a driver's traceback.
"""

from __future__ import annotations

import importlib.util
import re
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Engine, make_url

from schemas.errors import StorageFullError

from .. import file_modes

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"

#: Execution option marking the sessions that only read (SQLite then BEGINs without the write lock).
READ_ONLY = "normbridge_read_only"

#: How long a SQLite writer waits for the lock before failing (seconds).
SQLITE_BUSY_TIMEOUT = 60.0
#: SQLite's result code for 'database or disk is full' (a write, or its journal, found no room),
#: and PostgreSQL's SQLSTATE.
SQLITE_FULL = 13
POSTGRES_DISK_FULL = "53100"


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
        raise RuntimeError(
            f"the migrations in {MIGRATIONS / 'versions'} have heads {sorted(heads)}; exactly one expected"
        )
    return heads.pop()


def at_head(engine: Engine) -> bool:
    """Whether the database's schema is at the newest migration (False for an empty database or any doubt: Alembic
    decides)."""
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


def _refuse_full_disk(engine: Engine, parsed: URL) -> None:
    """Turn the driver's 'disk full' on any statement, commit or connect of `engine` into a StorageFullError naming the
    database (its transaction is rolled back: nothing of it was written)."""
    sqlite = parsed.get_backend_name() == "sqlite"
    where = parsed.database if sqlite else parsed.render_as_string(hide_password=True)
    hint = (
        "point NORMBRIDGE_DB (--db; default NORMBRIDGE_HOME/registry.db) at a disk with room"
        if sqlite
        else "ask the database's operator for room"
    )

    @event.listens_for(engine, "handle_error")
    def _on_error(context):
        original = context.original_exception
        if (
            sqlite
            and getattr(original, "sqlite_errorcode", None) == SQLITE_FULL
            or not sqlite
            and POSTGRES_DISK_FULL in (getattr(original, "pgcode", None), getattr(original, "sqlstate", None))
        ):
            raise StorageFullError(
                f"the registry database '{where}' has no room left ({str(original).strip()}); its write was undone: "
                f"free space on its disk, or {hint}, and try again.",
                setting="NORMBRIDGE_DB",
            ) from original


def make_engine(url: str | URL) -> Engine:
    """An engine for `url`; SQLite gets a busy timeout, WAL and BEGIN IMMEDIATE transactions, and a new database file
    the registry's file mode (registry/file_modes.py)."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite":
        engine = create_engine(parsed, pool_pre_ping=True)
        _refuse_full_disk(engine, parsed)
        return engine
    database = parsed.database
    if database and database != ":memory:" and not database.startswith("file:"):
        modes = file_modes.current()
        file_modes.make_folder(Path(database).expanduser().parent, modes)
        try:
            file_modes.create_file(
                Path(database), modes
            )  # before SQLite creates it with the umask's mode (its journals copy it)
        except FileNotFoundError:
            pass  # a path SQLite cannot open either: its own error names it
    engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT})
    _refuse_full_disk(engine, parsed)

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


__all__ = [
    "MIGRATIONS",
    "READ_ONLY",
    "SQLITE_BUSY_TIMEOUT",
    "alembic_config",
    "at_head",
    "head_revision",
    "make_engine",
    "normalize_url",
    "now",
]
