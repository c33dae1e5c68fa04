"""`normbridge pull`: a registered version back as a runnable model file, or its state dict as safetensors.

A thin shell over Registry.pull (registry/service/model_files.py) or, with --server, RemoteRegistry.pull (the
file streamed from GET /api/v1/models/NAME/versions/N/model, its digest checked before it is written).
"""

from __future__ import annotations


import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from ..app import app, console
from ..arguments import version_ref
from ..choices import PullFormat
from ..errors import reports_errors
from ..fitting import say, say_marked
from ..servable_text import blocking_text
from .registry import BLOBS_HELP, DB_HELP, _dump, _registry


def _pull_with_bar(registry, ref: str, output: str, fmt: str):
    """Registry.pull with a transient stderr bar over the blobs read and the bytes written
    (none when stderr is not a terminal)."""
    stderr = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        console=stderr,
        transient=True,
        disable=not stderr.is_terminal,
    ) as bar:
        task = bar.add_task(f"pulling {ref}", total=1)

        def progress(step: str, done: int, total: int) -> None:
            bar.update(task, description=f"{ref}: {step}", completed=done, total=max(total, 1))

        return registry.pull(ref, output, fmt, progress=progress)


@app.command()
@reports_errors
def pull(
    ref: str = typer.Argument(
        ..., metavar="NAME@REF", help="A version: NAME@N, NAME@alias or NAME (latest).", callback=version_ref
    ),
    output: str = typer.Option(
        ...,
        "--output",
        "-o",
        help="The file to write (atomically), or a folder to write NAME-N.<suffix> into "
        "(an existing one, or a path ending in '/', made if missing).",
    ),
    fmt: PullFormat = typer.Option(
        PullFormat.source,
        "--format",
        help="source: the format it was registered in (.onnx, .keras, .pt2); "
        "safetensors: the state dict as one file, normalizer specs in its metadata.",
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write a registered version as a runnable model in its source format, or its state dict as safetensors.

    Every blob is re-hashed on the way out (exit 12 if one was tampered with, and nothing is written); an ONNX file
    comes back byte-identical to the one registered; the structure was accepted by normbridge's safe reader when the
    version was registered, and the file is written straight to disk, atomically. A torch nn.Module registered from
    Python is stored as its state dict: pull it with --format safetensors. Example:
    normbridge pull resnet@production -o resnet.pt2
    """
    from registry.client import RemoteRegistry

    registry = _registry(db, blobs, json_output)
    if json_output or isinstance(registry, RemoteRegistry):  # over a server the download draws a byte bar instead
        result = registry.pull(ref, output, fmt.value)
    else:
        result = _pull_with_bar(registry, ref, output, fmt.value)
    if json_output:
        _dump(result)
        return
    console.print(f"[green]pulled[/] {result.ref} -> {result.path}", highlight=False)
    say(f"  format {result.format}, {result.nbytes} bytes, sha256 {result.digest}")
    record = registry.show(result.ref)
    if record.servable is False:  # an alias may have been forced onto it: the file is given back, and says what it is
        say_marked(
            "  [bold red]not servable[/]: ", f"{blocking_text(record)} (`normbridge show {result.ref}` says why)"
        )
