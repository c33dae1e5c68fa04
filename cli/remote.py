"""Where the registry commands send their work: the global `--server` / `--token` options, and byte progress bars.

`normbridge --server URL --token T <command>` (or env NORMBRIDGE_SERVER / NORMBRIDGE_TOKEN) makes the
registry commands talk to a `normbridge serve` server through registry.client.RemoteRegistry instead
of opening a database and blob store. The app callback stores the options here; the commands read them.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Iterator

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

SERVER_HELP = "URL of a `normbridge serve` registry server; the registry commands then run over HTTP."
TOKEN_HELP = "API token (nbt_...) for --server, from `normbridge token create` on the server host."


@dataclass
class RemoteOptions:
    server: str | None = None
    token: str | None = None


options = RemoteOptions()


def set_options(server: str | None, token: str | None) -> None:
    options.server = server or None
    options.token = token or None


@contextmanager
def _byte_bar(description: str, total: int | None) -> Iterator:
    """A transient stderr bar with bytes done/total and speed; invisible when stderr is not a terminal."""
    stderr = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
        disable=not stderr.is_terminal,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda done: bar.update(task, completed=done)


def _spinner(description: str):
    """A transient stderr spinner while the server works (nothing when stderr is not a terminal)."""
    stderr = Console(stderr=True)
    return stderr.status(description) if stderr.is_terminal else nullcontext()


def remote_registry(db: str | None, blobs: str | None, quiet: bool = False):
    """A RemoteRegistry when a server is set (None otherwise); --db/--blobs with --server is a usage error."""
    if options.server is None:
        return None
    given = [flag for flag, value in (("--db", db), ("--blobs", blobs)) if value is not None]
    if given:
        raise typer.BadParameter(
            f"a local registry cannot be combined with --server / NORMBRIDGE_SERVER ({options.server}); drop "
            f"{' and '.join(given)} or the server (the server uses its own database and blob store).",
            param_hint=" / ".join(given),
        )
    from registry.client import RemoteRegistry

    return RemoteRegistry(
        options.server, options.token, transfer=None if quiet else _byte_bar, waiting=None if quiet else _spinner
    )
