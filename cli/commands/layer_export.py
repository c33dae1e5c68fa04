"""`normbridge export-layers`: every normalization layer of a registry version, one file per layer,
through the converters.

Beside `normbridge export`, which exports a model file for serving: the registry stores normalization
state and weights, not a model's architecture, so a version exports as its layers. Local or, with
`--server`, over HTTP (the bundle is downloaded and re-hashed), like the other registry commands.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..app import app
from ..arguments import version_ref
from ..choices import FrameworkTarget
from ..errors import reports_errors
from .registry import BLOBS_HELP, DB_HELP, _dump, _registry, _say


@app.command(name="export-layers")
@reports_errors
def export_layers(
    ref: str = typer.Argument(
        ...,
        metavar="NAME@N",
        help="The version whose normalization layers to write (NAME@N or NAME@ALIAS).",
        callback=version_ref,
    ),
    to: FrameworkTarget = typer.Option(
        ...,
        "--to",
        help="onnx (one .onnx per layer), keras (one .keras one-layer model) or torch (a folder per layer: state_dict.safetensors plus its spec).",
    ),
    output: Path = typer.Option(..., "--output", "-o", help="The folder to write into (created if missing)."),
    json_output: bool = typer.Option(False, "--json", help="Print the exported layers as JSON."),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
) -> None:
    """Write every normalization layer of a registry version through the converters, one file per layer with its report.

    The registry stores normalization state and weights, not a model's architecture; to export a model file for
    serving, use normbridge export. Example: normbridge export-layers cnn@2 --to keras -o cnn2_layers/
    """
    result = _registry(db, blobs, json_output).export(ref, to.value, output)
    if json_output:
        _dump(result)
        return
    for layer in result.layers:
        _say(layer.report)
        _say(f"wrote {layer.file}", style="green")
    _say(f"exported {len(result.layers)} normalization layer(s) of {result.version} to {result.to} in {result.folder}")
