"""Where the registry lives when nobody says: zero configuration, overridable by env or flags.

Order: an explicit argument (`--db`, `--blobs`), then $NORMBRIDGE_DB / $NORMBRIDGE_BLOBS, then
SQLite and a blobs folder under $NORMBRIDGE_HOME, else ~/.local/share/normbridge
($XDG_DATA_HOME/normbridge when set), created on first use. The aliases guarded against a version
that is not servable: `serve --guarded-alias`, then $NORMBRIDGE_GUARDED_ALIASES, then production.
Where the CLI's gate checks the frameworks its process has not imported: the shared worker
(converters/gate/shared_worker.py) with its socket in $NORMBRIDGE_WORKER_DIR, else `workers/` in the data
folder, exiting after $NORMBRIDGE_WORKER_IDLE seconds (600) alone; NORMBRIDGE_GATE_WORKER=private
gives each process a worker of its own instead (read here, built into the CLI's Gate by
registry/worker_jobs.py `cli_gate`). A running shared worker registers into a local registry
for the CLI (registry/worker_jobs.py) unless NORMBRIDGE_REGISTER_IN_WORKER=0. What the registry creates is private to
its owner unless NORMBRIDGE_SHARED_GROUP=1 shares it with the folder's group (registry/file_modes.py).
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterable
from pathlib import Path

from schemas.errors import RegistryError

from . import file_modes

DB_ENV = "NORMBRIDGE_DB"
BLOBS_ENV = "NORMBRIDGE_BLOBS"
HOME_ENV = "NORMBRIDGE_HOME"
USER_ENV = "NORMBRIDGE_USER"
GUARDED_ALIASES_ENV = "NORMBRIDGE_GUARDED_ALIASES"
GATE_WORKER_ENV = "NORMBRIDGE_GATE_WORKER"
WORKER_DIR_ENV = "NORMBRIDGE_WORKER_DIR"
WORKER_IDLE_ENV = "NORMBRIDGE_WORKER_IDLE"
#: Seconds the shared gate worker stays up with no caller (it holds TensorFlow or torch in memory meanwhile).
DEFAULT_WORKER_IDLE = 600.0
#: Aliases that may point only at a servable version (registry/service/servable.py) unless forced.
DEFAULT_GUARDED_ALIASES = ("production",)


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
    file_modes.make_folder(folder)
    return f"sqlite:///{(folder / 'registry.db').resolve()}"


def blobs_uri(explicit: str | None = None) -> str:
    """The blob store URI: explicit, $NORMBRIDGE_BLOBS, or the `blobs` folder in the data folder (created)."""
    if explicit:
        return explicit
    if os.environ.get(BLOBS_ENV):
        return os.environ[BLOBS_ENV]
    folder = home() / "blobs"
    file_modes.make_folder(folder)
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


def guarded_aliases(explicit: Iterable[str] | None = None) -> frozenset[str]:
    """The aliases a not-servable version may not take without force: explicit (`serve --guarded-alias`), else
    $NORMBRIDGE_GUARDED_ALIASES (comma-separated; set but empty: none), else production."""
    if explicit is not None:
        return frozenset(name.strip() for name in explicit if name.strip())
    if GUARDED_ALIASES_ENV in os.environ:
        return frozenset(name.strip() for name in os.environ[GUARDED_ALIASES_ENV].split(",") if name.strip())
    return frozenset(DEFAULT_GUARDED_ALIASES)


def gate_worker() -> tuple[Path, float] | None:
    """(folder, idle seconds) of the shared gate worker the CLI uses, or None for a private worker per process.

    Raises:
        RegistryError: NORMBRIDGE_GATE_WORKER is neither 'shared' nor 'private',
            or NORMBRIDGE_WORKER_IDLE is not a positive number.
    """
    mode = os.environ.get(GATE_WORKER_ENV, "shared").strip().lower() or "shared"
    if mode not in ("shared", "private"):
        raise RegistryError(
            f"{GATE_WORKER_ENV} is {mode!r}; expected 'shared' (one warm worker serves every CLI process) or 'private' "
            "(a worker per process).",
            setting=GATE_WORKER_ENV,
        )
    if mode == "private":
        return None
    raw = os.environ.get(WORKER_IDLE_ENV, "").strip()
    try:
        idle = float(raw) if raw else DEFAULT_WORKER_IDLE
    except ValueError:
        idle = -1.0
    if not idle > 0:
        raise RegistryError(
            f"{WORKER_IDLE_ENV} is {raw!r}; expected the seconds the shared gate worker waits for a caller before it "
            "exits, a positive number such as 600.",
            setting=WORKER_IDLE_ENV,
        )
    folder = Path(os.environ[WORKER_DIR_ENV]).expanduser() if os.environ.get(WORKER_DIR_ENV) else home() / "workers"
    return folder, idle


__all__ = [
    "BLOBS_ENV",
    "DB_ENV",
    "DEFAULT_GUARDED_ALIASES",
    "DEFAULT_WORKER_IDLE",
    "GATE_WORKER_ENV",
    "GUARDED_ALIASES_ENV",
    "HOME_ENV",
    "USER_ENV",
    "WORKER_DIR_ENV",
    "WORKER_IDLE_ENV",
    "blobs_uri",
    "current_user",
    "database_url",
    "gate_worker",
    "guarded_aliases",
    "home",
]
