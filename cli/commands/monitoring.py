"""Monitoring commands: drift (serving inputs against BatchNorm statistics) and recalibrate."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from schemas.errors import DRIFT_ALARM_EXIT, DRIFT_UNCONVERGED_EXIT

from ..app import app, console
from ..arguments import version_ref
from ..errors import reports_errors
from ..files import check_headers, output_path
from ..fitting import print_table, say, say_marked

#: Exit code of `drift` when at least one layer alarms (0: no alarm): a verdict, not an error.
DRIFT_EXIT_CODE = DRIFT_ALARM_EXIT
#: Exit code of `drift` when no layer drifted but some layer's statistics never converged.
UNCONVERGED_EXIT_CODE = DRIFT_UNCONVERGED_EXIT


def _drift_table(report) -> Table:
    t = report.thresholds
    table = Table(
        title=f"BatchNorm input drift on {report.samples} samples (shift > {t.shift:g}, |log var ratio| > {t.log_ratio:.3g})"
    )
    for column, justify in (
        ("layer", "left"),
        ("channels", "right"),
        ("max shift", "right"),
        ("mean shift", "right"),
        ("max |log ratio|", "right"),
        ("worst channel", "right"),
        ("status", "left"),
    ):
        table.add_column(column, justify=justify)
    for layer in report.layers:
        ratio_only = layer.max_abs_log_ratio > t.log_ratio and layer.max_shift <= t.shift
        worst = layer.worst_ratio_channel if ratio_only else layer.worst_shift_channel
        table.add_row(
            layer.name,
            str(layer.channels),
            f"{layer.max_shift:.3f}",
            f"{layer.mean_shift:.3f}",
            f"{layer.max_abs_log_ratio:.3f}",
            str(worst),
            _STATUS_CELLS[layer.status],
        )
    return table


class _LocalRecorder:
    """The local registry with `record_drift` as a method, like RemoteRegistry's."""

    def __init__(self, registry):
        self.registry = registry

    def show(self, ref: str):
        return self.registry.show(ref)

    def record_drift(self, ref: str, report):
        from registry.drift_records import record_drift

        return record_drift(self.registry, ref, report)


def _recording_registry(record: str | None, db: str | None, blobs: str | None):
    """Where --record stores: the server given with --server (never a local registry then), else the local one;
    None without --record."""
    if record is None:
        return None
    from ..remote import remote_registry

    remote = remote_registry(db, blobs, quiet=True)
    if remote is not None:
        return remote
    from registry.service import Registry

    return _LocalRecorder(Registry(db=db, blobs=blobs))


#: How a layer's status reads in the table: an alarm is DRIFT only when the input moved.
_STATUS_CELLS = {
    "ok": "[green]-[/]",
    "drift": "[bold red]DRIFT[/]",
    "unconverged_statistics": "[yellow]unconverged_statistics[/]",
}


def _print_verdict(report) -> None:
    """The verdict line, then why the unconverged layers are not drift (each distinct reason once)."""
    total = len(report.layers)
    if report.alarms:
        console.print(
            f"[bold red]DRIFT[/] in {', '.join(report.alarms)} ({len(report.alarms)} of {total} BatchNorm layers drifted)"
        )
    if report.unconverged:
        say_marked(
            "[yellow]unconverged statistics[/] ",
            f"in {len(report.unconverged)} of {total} BatchNorm layers: their running "
            "statistics never converged, so their alarms say nothing about the served input (recalibrate or train longer)",
        )
        reasons: dict[str, list[str]] = {}
        for layer in report.layers:
            if layer.status == "unconverged_statistics" and layer.reason:
                reasons.setdefault(layer.reason, []).append(layer.name)
        for reason, names in reasons.items():
            say(f"  {names[0]}{f' and {len(names) - 1} more' if len(names) > 1 else ''}: {reason}")
    if not report.alarms and not report.unconverged:
        console.print(f"[green]no drift[/] (0 of {total} BatchNorm layers alarmed)")


@app.command()
@reports_errors
def drift(
    model_path: Path = typer.Argument(
        ..., metavar="MODEL", help="The served model: .onnx, .pt2 (torch.export) or a functional .keras model."
    ),
    data: Path = typer.Argument(
        ..., help="Serving inputs: .npy (one input) or .npz (one array per input), batch axis first; never unpickled."
    ),
    shift_threshold: float = typer.Option(
        0.5,
        "--shift-threshold",
        help="Alarm when |mean - running_mean| / sqrt(running_var + eps) exceeds this on a channel.",
    ),
    ratio_threshold: float = typer.Option(
        2.0,
        "--ratio-threshold",
        help="Alarm when var / running_var leaves [1/r, r] on a channel (r > 1; 2 = a factor of two).",
    ),
    batch_size: int = typer.Option(
        64, "--batch-size", help="Inputs per forward pass (memory only: statistics pool over all inputs)."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the drift report as JSON."),
    record: str | None = typer.Option(
        None,
        "--record",
        metavar="NAME@N",
        callback=version_ref,
        help="Store the report against this registered version (shown on its drift page).",
    ),
    db: str | None = typer.Option(
        None, "--db", help="With --record: SQLAlchemy URL of the registry database (env NORMBRIDGE_DB)."
    ),
    blobs: str | None = typer.Option(
        None, "--blobs", help="With --record: the registry's blob store (env NORMBRIDGE_BLOBS)."
    ),
) -> None:
    """Compare every BatchNorm layer's input statistics on serving data with its frozen running statistics.

    A layer alarms as DRIFT when its input moved, as unconverged_statistics when its running statistics never converged
    (few tracked batches for the momentum, values still near mean 0 / variance 1, or downstream of such a layer).
    Exit 0 when no layer alarms, 11 when one drifted, 23 when none drifted but some statistics never converged. --record
    refuses (exit 14) a report whose model holds other running statistics than the version; with the global --server it
    records on that server and opens no local registry.
    Example: normbridge drift model.onnx todays_inputs.npy --json --record resnet@3
    """
    from converters.models.monitoring.drift import drift_check
    from converters.models.loading import load_model
    from schemas import InputFileError
    from schemas.serving import DriftThresholds

    if ratio_threshold <= 1.0:
        raise InputFileError(
            f"--ratio-threshold {ratio_threshold} must be above 1 (a factor: 2 alarms when the variance halves or doubles)."
        )
    if shift_threshold <= 0:
        raise InputFileError(
            f"--shift-threshold {shift_threshold} must be positive (in standard deviations of the running statistics)."
        )
    thresholds = DriftThresholds(shift=shift_threshold, log_ratio=math.log(ratio_threshold))
    check_headers((model_path,), (data,))
    registry = _recording_registry(record, db, blobs)
    if record is not None:
        record = registry.show(record).ref  # fail before the forward passes when the version does not exist
    if json_output:
        report = drift_check(load_model(model_path), data, thresholds, batch_size=batch_size)
    else:
        with Console(stderr=True).status(f"measuring BatchNorm inputs of {model_path} on {data}"):
            report = drift_check(load_model(model_path), data, thresholds, batch_size=batch_size)
    stored = (
        registry.record_drift(record, report) if record is not None else None
    )  # a refusal prints no report, only its error
    if json_output:
        print(report.to_json())
    else:
        print_table(_drift_table(report))
        _print_verdict(report)
    if stored is not None:
        Console(stderr=True).print(
            f"recorded drift report {stored.id} against {stored.model}@{stored.number}: an offline check, shown "
            "beside the version's serving state and never counted in it",
            highlight=False,
            markup=False,
        )
    if report.alarms:
        raise typer.Exit(DRIFT_EXIT_CODE)
    if report.unconverged:
        raise typer.Exit(UNCONVERGED_EXIT_CODE)


@app.command()
@reports_errors
def recalibrate(
    model_path: Path = typer.Argument(
        ..., metavar="MODEL", help="The model to recalibrate: .onnx, .pt2 (torch.export) or .keras."
    ),
    data: Path = typer.Argument(
        ...,
        help="New inputs: .npy (one input) or .npz (one array per input, e.g. the traffic sample of monitor(..., keep_sample=N).save_sample), batch axis first; never unpickled.",
    ),
    output: Path = typer.Option(
        ..., "--output", "-o", help="Where to write the recalibrated model (same format as MODEL; written atomically)."
    ),
    batch_size: int = typer.Option(
        32, "--batch-size", help="Inputs per forward pass (memory only: the statistics are pooled over all samples)."
    ),
    biased: bool = typer.Option(
        False,
        "--biased",
        help="running_var as the population variance itself instead of PyTorch's unbiased n/(n-1) one.",
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the recalibration report as JSON."),
    register_from: str | None = typer.Option(
        None,
        "--register",
        metavar="NAME@N",
        callback=version_ref,
        help="Register the output as a 'recalibrated' child of this version (lineage and a diff "
        "against it); local with --db/--blobs, or over --server.",
    ),
    db: str | None = typer.Option(
        None, "--db", help="With --register: SQLAlchemy URL of the registry database (env NORMBRIDGE_DB)."
    ),
    blobs: str | None = typer.Option(
        None, "--blobs", help="With --register: the registry's blob store (env NORMBRIDGE_BLOBS)."
    ),
) -> None:
    """Re-estimate BatchNorm running statistics on new data (weights untouched) and write the new model.

    With --register NAME@N the new model becomes the next version of NAME, a 'recalibrated' child of NAME@N, and its
    diff against NAME@N is printed ("weights identical, running statistics changed in K layers"). Example: normbridge
    recalibrate model.onnx recent_traffic.npy -o model.recalibrated.onnx --register resnet@3
    """
    from converters.models.loading import load_model
    from converters.models.monitoring.recalibration import recalibrate as run_recalibration
    from converters.models.monitoring.recalibration import save_recalibrated
    from schemas import InputFileError

    from converters import REGISTRY

    if model_path.suffix.lower() not in REGISTRY.model_files():
        raise InputFileError(
            f"'{model_path}' is a '{model_path.suffix}' file; recalibrate takes an .onnx, .pt2 or .keras model."
        )
    if output.suffix.lower() != model_path.suffix.lower():
        raise InputFileError(
            f"output '{output}' must have the model's suffix '{model_path.suffix}'; the recalibrated model keeps its format."
        )
    output_path(output)
    check_headers((model_path,), (data,))
    registry = None
    if register_from is not None:
        from .registry import (
            _registry,
        )  # here, not at the top: importing it first would list its commands before these in --help

        registry = _registry(db, blobs, json_output)
        register_from = registry.show(
            register_from
        ).ref  # fail before the forward passes when the parent does not exist
    model = load_model(model_path)
    if json_output:
        new, report = run_recalibration(
            model, data, batch_size=batch_size, variance_estimator="biased" if biased else "unbiased"
        )
    else:
        with Console(stderr=True).status(f"recalibrating {model_path} on {data}"):
            new, report = run_recalibration(
                model, data, batch_size=batch_size, variance_estimator="biased" if biased else "unbiased"
            )
    save_recalibrated(new, output)
    report = report.model_copy(update={"output": str(output)})
    headline = None
    if registry is not None:
        report, headline = register_recalibrated(registry, register_from, output, data, report)
    if json_output:
        print(report.to_json())
    else:
        table = Table(
            title=f"recalibrated {len(report.layers)} BatchNorm layer(s) on {report.samples} samples in {report.batches} batches"
        )
        for column in ("layer", "channels", "max |Δmean|/std", "max |log var ratio|"):
            table.add_column(column, justify="left" if column == "layer" else "right")
        for layer in report.layers:
            table.add_row(
                layer.name, str(layer.channels), f"{layer.max_mean_shift:.4f}", f"{layer.max_abs_log_var_ratio:.4f}"
            )
        print_table(table)
        say(f"method: {report.method}")
        for note in report.notes:
            say(f"note: {note}")
        say_marked("[green]wrote[/] ", str(output))
        if report.registered:
            say_marked("[green]registered[/] ", f"{report.version} (recalibrated from {register_from}): {headline}")
        else:
            say(register_hint(output))


def register_recalibrated(registry, parent: str, output: Path, data: Path, report):
    """Register `output` as the recalibrated child of `parent`; (report with the new version, the diff's headline)."""
    name = parent.split("@", 1)[0]
    note = f"recalibrated on {report.samples} samples of {data.name} in {report.batches} batches"
    result = registry.register(name, output, parent=parent, operation="recalibrated", note=note)
    version = f"{result.version.model}@{result.version.number}"
    headline = registry.diff(parent, version).headline
    return report.model_copy(
        update={"registered": True, "version": version, "parent": parent, "diff": headline}
    ), headline


def register_hint(output: Path) -> str:
    """How to register a recalibrated file with its lineage, printed when recalibrate ran without --register."""
    return (
        f"to register it as the next version of its model: normbridge register NAME {output} --parent NAME@N --operation recalibrated "
        "(or recalibrate with --register NAME@N)"
    )
