"""The Typer application and console every command module registers on."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    name="normbridge",
    help="Move normalization layers between PyTorch, Keras 3 and ONNX without changing what they compute.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
