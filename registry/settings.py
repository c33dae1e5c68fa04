"""Where the registry lives when nobody says: zero configuration, overridable by env or flags.

Order: an explicit argument (`--db`, `--blobs`), then $NORMBRIDGE_DB / $NORMBRIDGE_BLOBS, then
SQLite and a blobs folder under $NORMBRIDGE_HOME, else ~/.local/share/normbridge
($XDG_DATA_HOME/normbridge when set), created on first use.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path

DB_ENV = "NORMBRIDGE_DB"
BLOBS_ENV = "NORMBRIDGE_BLOBS"
HOME_ENV = "NORMBRIDGE_HOME"
USER_ENV = "NORMBRIDGE_USER"


def home() -> Path:
    """The data folder of the embedded default (not created here)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "normbridge"


def database_url(explicit: str | None = None) -> str:
    """The SQLAlchemy URL: explicit, $NORMBRIDGE_DB, or SQLite in the data folder (folder created)."""
    if explicit:
        return explicit
    if os.environ.get(DB_ENV):
        return os.environ[DB_ENV]
    folder = home()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(folder / 'registry.db').resolve()}"


def blobs_uri(explicit: str | None = None) -> str:
    """The blob store URI: explicit, $NORMBRIDGE_BLOBS, or the `blobs` folder in the data folder (created)."""
    if explicit:
        return explicit
    if os.environ.get(BLOBS_ENV):
        return os.environ[BLOBS_ENV]
    folder = home() / "blobs"
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder.resolve())


def current_user(explicit: str | None = None) -> str:
    """Who is acting, for the audit log: explicit, $NORMBRIDGE_USER, else the login name."""
    if explicit:
        return explicit
    if os.environ.get(USER_ENV):
        return os.environ[USER_ENV]
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in some containers
        return "unknown"


__all__ = ["BLOBS_ENV", "DB_ENV", "HOME_ENV", "USER_ENV", "blobs_uri", "current_user", "database_url", "home"]
