"""One place that turns library errors into a message on stderr and the mapped exit code."""

from __future__ import annotations

import functools
import json
import os
import select
import sys
from typing import Callable

import typer
from rich.console import Console

from schemas.errors import NormbridgeError, exit_code_for
from schemas.extras import missing_dependency

stderr = Console(stderr=True)
#: Exit status when the reader of standard output closed it (`normbridge versions NAME | head -1`): 128 + SIGPIPE, what
#: a Unix tool that SIGPIPE ends reports. Click's own handling said 1, which this CLI keeps for crashes.
OUTPUT_CLOSED_EXIT = 141


def reports_errors(func: Callable) -> Callable:
    """Decorator: NormbridgeError -> one red line (or JSON with --json) and its exit code; an optional package that is
    not installed is one too (schemas/extras.py names its extra)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except NormbridgeError as error:
            report(error, json_output=kwargs.get("json_output"))
        except ModuleNotFoundError as error:
            missing = missing_dependency(error)
            if missing is None:
                raise
            report(missing, json_output=kwargs.get("json_output"))
        except BrokenPipeError:
            if not _stdout_closed():
                raise  # a socket's (the gate worker, a server): an error of the command, not of its reader
            output_closed()

    return wrapper


def report(error: NormbridgeError, *, json_output: bool | None = None) -> None:
    """Print `error` as one line on stderr (a JSON object on stdout with --json) and exit with its code."""
    if json_output:
        print(json.dumps({"error": error.to_dict()}))
    else:
        stderr.print(f"[bold red]error[/] ({error.code}): ", end="", highlight=False)
        stderr.print(str(error), highlight=False, soft_wrap=True, markup=False)
    raise typer.Exit(exit_code_for(error)) from None


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), no file descriptor
        return False


def output_closed() -> None:
    """The reader of standard output has gone: point it at /dev/null so the exit's flush is quiet, and end with
    OUTPUT_CLOSED_EXIT. Called for the errors raised here and by the output console (cli.app.OutputConsole)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise typer.Exit(OUTPUT_CLOSED_EXIT)
