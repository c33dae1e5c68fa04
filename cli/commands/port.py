"""Model command: port (copy normalization state from a model into its twin in another framework)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ..app import app, console
from ..errors import reports_errors
from ..files import check_headers, output_path
from ..fitting import print_table, say, say_marked
from .layers import CumulativeMomentum


@app.command()
@reports_errors
def port(
    source: Path = typer.Argument(
        ...,
        help="Model to copy normalization state from: .pt2 (torch.export), .keras or .onnx (native normalization nodes).",
    ),
    target: Path = typer.Argument(
        ...,
        help="Its twin to copy into: a .keras model. PyTorch targets are supported through the Python API: "
        "converters.models.porting.port_state(source, nn_module).",
    ),
    output: Path = typer.Option(
        ..., "--output", "-o", help="Where to write the target with the ported state (.keras, written atomically)."
    ),
    name_map: Optional[Path] = typer.Option(
        None,
        "--name-map",
        help="JSON object {source layer path: target layer name}; layers it does not name are paired by name when both models name them alike, else by order among the rest.",
    ),
    cumulative_momentum: CumulativeMomentum = typer.Option(
        CumulativeMomentum.error,
        help="PyTorch momentum=None: refuse (error) or emit the next step's momentum (next_step).",
    ),
    details: bool = typer.Option(
        False, "--details", help="Print every translation of every layer, not only the pairs and warnings."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the pairs and the full fidelity report as JSON."),
) -> None:
    """Copy every normalization layer's weights, statistics, eps and momentum from SOURCE into its twin TARGET.

    Layers pair by name when both models name them alike, else by order, checked by kind and shape; a count or shape
    mismatch is refused and nothing is written. Only normalization state moves:
    copy convolution and dense weights yourself.

    Example: normbridge port resnet.pt2 resnet_twin.keras -o resnet_ported.keras
    """
    from converters.models.loading import load_model
    from converters.models.porting import port_state
    from converters.options import ConversionOptions
    from schemas import InputFileError

    if output.suffix.lower() != ".keras":
        raise typer.BadParameter(
            f"'{output}' must end in .keras (the target is written as a Keras model).", param_hint="--output"
        )
    if target.suffix.lower() != ".keras":
        raise InputFileError(
            f"the target '{target}' is not a .keras file; the command line writes Keras targets only, PyTorch targets go through "
            "converters.models.porting.port_state(source, nn_module)."
        )
    output_path(output)
    check_headers((source, target))  # both files, before either framework loads one
    mapping = _read_name_map(name_map) if name_map is not None else None
    # registered class, in case the target holds one
    import converters.keras_adapter.unbiased_batch_normalization  # noqa: F401

    source_model = load_model(source)
    target_model = load_model(target)
    report = port_state(
        source_model, target_model, mapping, ConversionOptions(cumulative_momentum=cumulative_momentum.value)
    )
    _save_keras(target_model, output)
    if json_output:
        pairs = [{"source": layer.layer, "target": _value(layer, "layer", "target_value")} for layer in report.layers]
        print(
            json.dumps(
                {
                    "source": str(source),
                    "target": str(target),
                    "output": str(output),
                    "pairs": pairs,
                    "report": report.model_dump(mode="json"),
                },
                indent=2,
            )
        )
        return
    if details:
        say(report.render_text())
    else:
        print_table(_pairs_table(report))
        for warning, count in _grouped_warnings(report):
            prefix = f"{count} layers: " if count > 1 else ""
            say_marked(f"[yellow]warning[/] {prefix}", warning)
    console.print(
        f"[green]ported[/] {len(report.layers)} normalization layers; [green]wrote[/] {output}", highlight=False
    )


def _read_name_map(path: Path) -> dict[str, str]:
    from schemas import InputFileError

    try:
        mapping = json.loads(path.read_text())
    except OSError as error:
        raise InputFileError(
            f"cannot read the name map '{path}' ({error.strerror or error}); check the path."
        ) from error
    except ValueError as error:
        raise InputFileError(
            f'the name map \'{path}\' is not JSON ({error}); expected an object {{"source path": "target name"}}.'
        ) from error
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise InputFileError(
            f'the name map \'{path}\' holds a {type(mapping).__name__}, expected a JSON object of strings {{"source path": "target name"}}.'
        )
    return mapping


def _save_keras(model, output: Path) -> None:
    from schemas.atomic_io import atomic_write_bytes

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.keras"
        model.save(path)
        atomic_write_bytes(output, path.read_bytes())


def _value(layer, setting: str, side: str):
    for translation in layer.translations:
        if translation.setting == setting:
            return getattr(translation, side)
    return None


def _arrow(layer, setting: str) -> str:
    for translation in layer.translations:
        if translation.setting == setting:
            if translation.fate == "exact":
                return repr(translation.source_value)
            return f"{translation.source_value!r} -> {translation.target_value!r}"
    return ""


def _pairing(layer) -> str:
    """'3/10' (by order), 'map' or 'name', from the report's pairing note."""
    note = next((t.note for t in layer.translations if t.setting == "layer"), "")
    if "name map" in note:
        return "map"
    if "by name" in note:
        return "name"
    numbers = [word for word in note.replace(",", " ").split() if word.isdigit()]
    return f"{numbers[0]}/{numbers[1]}" if len(numbers) == 2 else note


def _pairs_table(report) -> Table:
    table = Table(title="normalization layers ported", title_justify="left")
    for column in ("source", "target"):
        table.add_column(column, overflow="fold")
    for column in ("kind", "pair", "eps", "momentum", "tensors"):
        table.add_column(column, no_wrap=True)
    for layer in report.layers:
        exact = sum(1 for t in layer.translations if t.note == "bit-identical")
        table.add_row(
            layer.layer,
            str(_value(layer, "layer", "target_value")),
            layer.kind,
            _pairing(layer),
            _arrow(layer, "eps"),
            _arrow(layer, "momentum"),
            f"{exact} exact" if exact else "",
        )
    return table


def _grouped_warnings(report) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for layer in report.layers:
        for warning in layer.warnings:
            counts[warning] = counts.get(warning, 0) + 1
    return list(counts.items())
