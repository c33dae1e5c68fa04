"""Layer commands: convert, check, schema."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from ..app import app
from ..arguments import conversion_opset, frameworks
from ..choices import Target
from ..errors import reports_errors
from ..fitting import say, say_marked


class CumulativeMomentum(str, Enum):
    error = "error"
    next_step = "next_step"


@app.command()
@reports_errors
def convert(
    source: Path = typer.Argument(
        ..., help="A spec folder (spec.json + tensors.safetensors) or an .onnx file with one normalization layer."
    ),
    to: Target = typer.Option(
        ...,
        "--to",
        metavar="TARGET",
        help="Target: spec (folder), onnx (.onnx), keras (.keras one-layer model), torch (folder with state_dict.safetensors + spec).",
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the result (written atomically)."),
    opset: int = typer.Option(
        23,
        callback=conversion_opset,
        help="ONNX opset; native LayerNorm >= 17, GroupNorm >= 21, RMSNorm >= 23, decompositions below.",
    ),
    training_mode: bool = typer.Option(
        False,
        "--training-mode",
        help="Allow a train-mode BatchNorm into ONNX as training_mode=1 (outputs then depend on the batch).",
    ),
    match_estimator: bool = typer.Option(
        False, "--match-estimator", help="Emit a subclass so running_var updates use the source's variance estimator."
    ),
    cumulative_momentum: CumulativeMomentum = typer.Option(
        CumulativeMomentum.error,
        help="PyTorch momentum=None: refuse (error) or emit the next step's momentum (next_step).",
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the fidelity report as JSON."),
) -> None:
    """Convert one normalization layer and print the fidelity report.

    Example: normbridge convert bn_spec/ --to onnx -o bn.onnx --opset 23
    """
    from converters import write_layer
    from converters.api import read_spec, write_spec
    from converters.options import ConversionOptions
    from schemas import ConversionReport, NormSpec

    from ..files import load_layer, output_path

    if to.value == "keras" and output.suffix.lower() != ".keras":
        raise typer.BadParameter(
            f"'{output}' does not end in .keras, and Keras loads only files that do; pass -o {output.name}.keras "
            "(a one-layer Keras model).",
            param_hint="--output",
        )
    output_path(output, folder=to.value == "spec" or (to.value == "torch" and output.suffix != ".safetensors"))
    options = ConversionOptions(
        opset=opset,
        onnx_training_mode=training_mode,
        match_variance_estimator=match_estimator,
        cumulative_momentum=cumulative_momentum.value,
    )
    loaded = load_layer(source)
    spec, layer_report = (loaded, None) if isinstance(loaded, NormSpec) else read_spec(loaded)
    obj = spec
    if to.value != "spec":
        obj, layer_report = write_spec(spec, to.value, options, layer_report)
    write_layer(obj, spec, to.value, output)
    report = ConversionReport(layers=[layer_report] if layer_report else [])
    if json_output:
        print(json.dumps({"output": str(output), "report": report.model_dump(mode="json")}, indent=2))
    else:
        say(report.render_text())
        say_marked("[green]wrote[/] ", str(output))


@app.command()
@reports_errors
def check(
    source: Path = typer.Argument(..., help="A spec folder or an .onnx file with one normalization layer."),
    framework: Optional[list[str]] = typer.Option(
        None,
        "--framework",
        "-f",
        metavar="FRAMEWORK",
        callback=frameworks,
        help="Limit the targets (repeatable): torch, keras, onnx.",
    ),
    opset: int = typer.Option(23, callback=conversion_opset, help="ONNX opset used for the ONNX leg."),
    json_output: bool = typer.Option(False, "--json", help="Print the structured result as JSON."),
) -> None:
    """Round-trip a layer through every framework and compare against the NumPy reference.

    Exit 0 when it passes, 7 when it fails. Example: normbridge check bn_spec/ --json
    """
    from converters import check as run_check
    from converters.options import ConversionOptions

    from ..files import load_layer

    result = run_check(load_layer(source), frameworks=framework or None, options=ConversionOptions(opset=opset))
    if json_output:
        print(result.to_json())
    else:
        say(result.render_text())
    if not result.passed:
        raise typer.Exit(7)


@app.command()
@reports_errors
def schema(
    name: str = typer.Argument(
        "normspec",
        help="normspec, conversion_report, check_result, model_inspection, contract_result, export_result, drift_report, recalibration_report, drift_window or drift_history.",
    ),
) -> None:
    """Print the JSON Schema of the spec, the fidelity report or the check result.

    Example: normbridge schema normspec > normspec.schema.json
    """
    from schemas.json_schema import schema_documents

    documents = schema_documents()
    key = f"{name}.schema.json"
    if key not in documents:
        raise typer.BadParameter(
            f"'{name}' is not a schema; choose one of {', '.join(k.split('.')[0] for k in documents)}.",
            param_hint="'name'",
        )
    print(documents[key], end="")
