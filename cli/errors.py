"""One place that turns library errors into a message on stderr and the mapped exit code."""

from __future__ import annotations

import functools
import json
from typing import Callable

import typer
from rich.console import Console

from schemas.errors import NormbridgeError, exit_code_for

stderr = Console(stderr=True)


def reports_errors(func: Callable) -> Callable:
    """Decorator: NormbridgeError -> one red line (or JSON with --json) and its exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except NormbridgeError as error:
            if kwargs.get("json_output"):
                print(json.dumps({"error": error.to_dict()}))
            else:
                stderr.print(f"[bold red]error[/] ({error.code}): ", end="", highlight=False)
                stderr.print(str(error), highlight=False, soft_wrap=True, markup=False)
            raise typer.Exit(exit_code_for(error)) from None

    return wrapper
