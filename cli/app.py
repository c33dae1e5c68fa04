"""The Typer application and console every command module registers on."""

from __future__ import annotations

import typer
from rich.console import Console

from . import remote

app = typer.Typer(
    name="normbridge",
    help="Move normalization layers between PyTorch, Keras 3 and ONNX without changing what they compute.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()


@app.callback()
def global_options(
    server: str | None = typer.Option(None, "--server", envvar="NORMBRIDGE_SERVER", help=remote.SERVER_HELP),
    token: str | None = typer.Option(None, "--token", envvar="NORMBRIDGE_TOKEN", help=remote.TOKEN_HELP, show_default=False),
) -> None:
    """Move normalization layers between PyTorch, Keras 3 and ONNX without changing what they compute.

    With --server URL (env NORMBRIDGE_SERVER) the registry commands (register, models, versions, show, diff,
    lineage, verify, alias, audit, gc, export NAME@N) run against a `normbridge serve` server.
    Example: normbridge --server http://registry:8080 --token nbt_... models
    """
    remote.set_options(server, token)
