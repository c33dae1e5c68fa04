"""A fresh PostgreSQL database per test (or module) from NORMBRIDGE_TEST_DATABASE_URL, dropped afterwards.

The URL names a server and a database we may connect to (default: the `test` database of the
local server .ci/run starts); each user of `fresh_database()` gets its own randomly named
database created with CREATE DATABASE and dropped WITH (FORCE), so pytest-xdist workers never
share tables. Unreachable server: the test FAILS when CI=true and is skipped otherwise.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from registry.db.engine import normalize_url

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def server_url() -> str:
    return os.environ.get("NORMBRIDGE_TEST_DATABASE_URL", DEFAULT_URL)


def _unavailable(reason: str) -> None:
    message = f"PostgreSQL at {make_url(server_url()).render_as_string(hide_password=True)} is unreachable: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (CI=true: PostgreSQL tests must run)")
    pytest.skip(message + " (set NORMBRIDGE_TEST_DATABASE_URL or start PostgreSQL)")


@contextmanager
def fresh_database() -> Iterator[str]:
    """Yield the URL of a new, empty database; drop it on exit."""
    admin_url = normalize_url(server_url())
    try:
        admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
        with admin.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as error:
        _unavailable(str(error).splitlines()[0] if str(error) else type(error).__name__)
        raise  # unreachable: _unavailable always raises
    name = f"nb_test_{uuid.uuid4().hex[:16]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """One fresh PostgreSQL database for the whole test module."""
    with fresh_database() as url:
        yield url


@contextmanager
def registry_on(backend: str, folder, user: str):
    """A registry.service.Registry on 'sqlite' (a file in `folder`) or 'postgresql' (a fresh database),
    blobs in `folder`."""
    from registry.service import Registry

    if backend == "sqlite":
        registry = Registry(db=f"sqlite:///{folder / 'registry.db'}", blobs=str(folder / "blobs"), user=user)
        try:
            yield registry
        finally:
            registry.meta.close()
        return
    with fresh_database() as url:
        registry = Registry(db=url, blobs=str(folder / "blobs"), user=user)
        try:
            yield registry
        finally:
            registry.meta.close()
