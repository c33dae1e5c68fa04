"""The Typer application and console every command module registers on, with the global options."""

from __future__ import annotations

import os
import sys
from importlib import metadata

import typer
from rich.console import Console

from . import framework_noise, remote
from .errors import output_closed


class OutputConsole(Console):
    """Standard output's console: when its reader leaves (`normbridge versions NAME | head -1`) the command ends with
    exit 141 (cli.errors.OUTPUT_CLOSED_EXIT), not the 1 Rich exits with, which this CLI keeps for crashes."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        output_closed()


console = OutputConsole()


#: Click's base of the errors it reports itself (usage mistakes); Typer 0.22+ vendors Click, so it is found from the
#: public `typer.BadParameter` rather than imported from either package.
CLICK_ERROR: type[Exception] = next(base for base in typer.BadParameter.__mro__ if base.__name__ == "ClickException")


class NormbridgeGroup(typer.core.TyperGroup):
    """The root group: a flag shows no `<bool>` placeholder in --help (it takes no value),
    in every command and subcommand."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _blank_flag_metavars(self)

    def get_params(self, ctx):
        params = super().get_params(ctx)  # Typer appends --install-completion / --show-completion after __init__
        _blank(params)
        return params

    def main(
        self, args=None, prog_name=None, complete_var=None, standalone_mode=True, windows_expand_args=True, **extra
    ):
        """Run the command; a usage mistake is reported in the style of every other error (`error (usage): ...` and the
        command's usage line, exit 2) rather than in Typer's box."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, windows_expand_args, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except CLICK_ERROR as error:
            usage_error(error)
        except typer.Abort:
            sys.stderr.write("Aborted!\n")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def usage_error(error) -> None:
    """Print a usage mistake as one `error (usage):` line and the command's usage line on stderr;
    exit with its code (2)."""
    stderr = Console(stderr=True)
    stderr.print("[bold red]error[/] (usage): ", end="", highlight=False)
    stderr.print(error.format_message(), highlight=False, soft_wrap=True, markup=False)
    context = getattr(error, "ctx", None)
    if context is not None:
        usage = context.get_usage().removeprefix("Usage: ")
        stderr.print(
            f"  usage: {usage}; `{context.command_path} --help` lists the options",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    sys.exit(error.exit_code)


def _blank(params) -> None:
    for param in params:
        if (
            param.param_type_name == "option"
            and getattr(param, "is_flag", False)
            and not getattr(param, "count", False)
            and param.metavar is None
        ):
            param.metavar = ""


def _blank_flag_metavars(command) -> None:
    """Blank the metavar of every flag of `command` and its subcommands, --help included
    (created here, as click caches it)."""
    _blank(command.params)
    help_option = command.get_help_option(typer.Context(command))
    if help_option is not None:
        _blank([help_option])
    for sub in getattr(command, "commands", {}).values():
        _blank_flag_metavars(sub)


app = typer.Typer(
    name="normbridge",
    cls=NormbridgeGroup,
    help="Move normalization layers between PyTorch, Keras 3 and ONNX without changing what they compute.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def package_version() -> str:
    """The installed normbridge version (from its package metadata)."""
    try:
        return metadata.version("normbridge")
    except metadata.PackageNotFoundError:
        return "unknown (not installed; run `pip install -e .`)"


def _print_version(value: bool) -> None:
    if value:
        print(f"normbridge {package_version()}")
        raise typer.Exit()


def fit_console_to_terminal() -> None:
    """Let the console measure the terminal (or COLUMNS) when it prints, not when cli.app was imported."""
    console.width = None  # Rich then reads COLUMNS, else the terminal's size, at every print (80 for a pipe)


@app.callback()
def global_options(
    server: str | None = typer.Option(None, "--server", envvar="NORMBRIDGE_SERVER", help=remote.SERVER_HELP),
    token: str | None = typer.Option(
        None, "--token", envvar="NORMBRIDGE_TOKEN", help=remote.TOKEN_HELP, show_default=False
    ),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        envvar=framework_noise.VERBOSE_ENV,
        help="Also print the frameworks' own log lines and warnings (TensorFlow, absl, torch.onnx, tf2onnx) on stderr.",
    ),
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print normbridge's version and exit."
    ),
) -> None:
    """Move normalization layers between PyTorch, Keras 3 and ONNX without changing what they compute.

    With --server URL (env NORMBRIDGE_SERVER) the registry commands (register, models, versions, show, diff,
    lineage, verify, alias, audit, gc, export NAME@N) run against a `normbridge serve` server.
    Example: normbridge --server http://registry:8080 --token nbt_... models
    """
    framework_noise.configure(verbose)
    os.environ.setdefault(
        "NORMBRIDGE_LEAN_IMPORTS", "1"
    )  # Keras without scikit-learn, matplotlib, pandas (converters/lean_imports.py)
    fit_console_to_terminal()
    if token and not server:  # a token means a server was meant: never open the local registry with it
        raise typer.BadParameter(
            "a token is for a `normbridge serve` server, and no server is given; pass --server URL (or set "
            "NORMBRIDGE_SERVER) too, or drop --token / NORMBRIDGE_TOKEN to use the local registry.",
            param_hint="--token",
        )
    remote.set_options(server, token)
