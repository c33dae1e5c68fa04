"""`normbridge inspect`: list a model's normalization layers with their state and hazards."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from schemas.errors import HAZARD_FOUND_EXIT

from ..app import app, console
from ..errors import reports_errors
from ..fitting import print_narrowing_table
from ..hazard_text import say_hazard_groups

#: Exit code of `inspect --fail-on SEVERITY` when a hazard at or above SEVERITY exists.
HAZARD_EXIT_CODE = HAZARD_FOUND_EXIT


#: The shortest a layer path is cut to (middle elided) so that the layers table keeps its columns.
SHORTEST_LABEL = 24
#: How much shorter each next try cuts the paths.
LABEL_STEP = 4


def _label_widths(paths: list[str]) -> list[int]:
    """Widths to try for the path column, longest first: whole paths, then shorter cuts down to SHORTEST_LABEL."""
    longest = max((len(p) for p in paths), default=0)
    return [longest, *range(longest - LABEL_STEP, SHORTEST_LABEL - 1, -LABEL_STEP)]


class FailOn(str, Enum):
    error = "error"
    warning = "warning"
    info = "info"


@app.command(name="inspect")
@reports_errors
def inspect_command(
    path: Path = typer.Argument(
        ...,
        help="A model file: .pt2 (torch.export), .keras (loaded with safe_mode), .onnx; a spec folder, or a Hugging Face checkpoint folder (config.json + safetensors).",
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the inspection as JSON."),
    fail_on: Optional[FailOn] = typer.Option(
        None,
        "--fail-on",
        help=f"Exit {HAZARD_EXIT_CODE} when a hazard of this severity or worse is found (default: exit 0 whatever is found).",
    ),
) -> None:
    """List every normalization layer of a model: spec, mode, running statistics and hazards.

    Hazards include a layer left in train mode, statistics never updated, an eps that is not the
    framework's default, momentum=None, a normalization decomposed into primitive ops and a
    BatchNorm folded into a Conv. Pickle-based files are refused (exit 6): loading them can execute code.

    Example: normbridge inspect resnet.pt2 --fail-on error
    """
    from converters.models.inspection import inspect_model
    from converters.models.loading import load_model
    from schemas.hazard_groups import group_hazards
    from schemas.inspection import inspection_table
    from schemas.labels import distinct_labels

    if json_output:
        model = load_model(path, checkpoint_folders=True)
    else:
        with Console(stderr=True).status(f"loading {path}"):
            model = load_model(path, checkpoint_folders=True)
    inspection = inspect_model(model, source=str(path))
    if json_output:
        print(inspection.to_json())
    else:
        paths = [layer.path for layer in inspection.layers]
        tables = (inspection_table(inspection, distinct_labels(paths, width)) for width in _label_widths(paths))
        print_narrowing_table(tables)
        hazards = inspection.all_hazards()
        if not inspection.layers:
            console.print("no normalization layers found", highlight=False)
        say_hazard_groups(group_hazards((where, h.code, h.severity, h.message, False) for where, h in hazards))
        if not hazards:
            console.print("[green]no hazards[/]")
    if fail_on is not None and inspection.has_hazard_at_least(fail_on.value):
        raise typer.Exit(HAZARD_EXIT_CODE)
