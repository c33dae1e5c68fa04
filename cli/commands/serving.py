"""Serving commands: export a model for serving (verified, rewritten to native ops, contract-tested) and the contract
test alone."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from ..app import app, console
from ..arguments import version_ref
from ..choices import FrameworkTarget
from ..errors import reports_errors
from ..files import check_headers, output_path
from ..fitting import print_table, say, say_marked
from ..hazard_text import say_hazard_groups


def _check_failed_code() -> int:
    from schemas.errors import CheckFailedError, exit_code_for

    return exit_code_for(CheckFailedError("contract failed"))


def contract_tables(result) -> list[Table]:
    """Rich tables of a ContractResult: per-output errors, then batch independence per side."""
    outputs = Table(title="outputs: source vs serving (onnxruntime)")
    for column, justify in (
        ("output", "left"),
        ("shape", "left"),
        ("max abs error", "right"),
        ("max rel error", "right"),
        ("verdict", "left"),
    ):
        outputs.add_column(column, justify=justify)
    for o in result.outputs:
        outputs.add_row(
            o.name,
            f"{o.dtype}[{','.join(str(d) for d in o.shape)}]",
            "n/a" if o.max_abs_error is None else f"{o.max_abs_error:.3e}",
            "n/a" if o.max_rel_error is None else f"{o.max_rel_error:.3e}",
            "[green]ok[/]" if o.passed else f"[bold red]MISMATCH[/] {o.reason}".rstrip(),
        )
    batch = Table(title="batch independence: each request alone vs in its batch")
    for column, justify in (
        ("side", "left"),
        ("method", "left"),
        ("requests", "right"),
        ("max abs diff", "right"),
        ("deterministic", "left"),
        ("verdict", "left"),
    ):
        batch.add_column(column, justify=justify)
    for b in result.batch_independence:
        batch.add_row(
            b.side,
            b.method,
            str(b.requests),
            "n/a" if b.max_abs_difference is None else f"{b.max_abs_difference:.3e}",
            "yes" if b.deterministic else "[bold red]NO[/]",
            _batch_verdict(b),
        )
    return [outputs, batch]


def _batch_verdict(check) -> str:
    """ok / FAILED, or "skipped" when the test could not run (one request): never "ok" for a test that did not run."""
    if check.method == "skipped":
        return "[yellow]skipped[/]" if check.passed else "[bold red]skipped, FAILED[/]"
    return "[green]ok[/]" if check.passed else "[bold red]FAILED[/]"


def print_contract(result) -> None:
    tol = ", ".join(f"{t.dtype} atol {t.atol:g} rtol {t.rtol:g}" for t in result.tolerances)
    for label, text in (
        ("source", result.source),
        ("serving", f"{result.serving} [{result.runtime}]"),
        ("sample", result.sample.description),
        ("tolerance", tol),
    ):
        say(f"{label + ':':<10} {text}")
    for table in contract_tables(result):
        print_table(table)
    for b in result.batch_independence:
        if b.reason:
            say(f"{b.side}: batch independence {'skipped: ' if b.method == 'skipped' else ''}{b.reason}")
    for finding in result.findings:
        say_marked("[yellow]finding[/]: ", finding)
    for error in result.errors:
        say_marked("[bold red]error[/]: ", error)
    console.print("[green]contract PASSED[/]" if result.passed else "[bold red]contract FAILED[/]")


def _verification_table(result) -> Table:
    sites = len({(v.site, v.source_layer) for v in result.verification})
    failed = [v for v in result.verification if not v.passed]
    table = Table(
        title=f"verification: {sites} normalization sites, {len(result.verification)} settings checked, {len(failed)} failed"
    )
    for column in ("source layer", "graph site", "kind", "eps", "checked", "verdict"):
        table.add_column(column, overflow="fold")
    by_site: dict[tuple, list] = {}
    for v in result.verification:
        by_site.setdefault((v.source_layer, v.site, v.kind), []).append(v)
    for (layer, site, kind), entries in by_site.items():
        bad = [e for e in entries if not e.passed]
        eps = next((e.found for e in entries if e.setting == "eps"), "-")
        verdict = (
            "[green]ok[/]"
            if not bad
            else "[bold red]FAILED[/] " + "; ".join(f"{e.setting}: expected {e.expected}, found {e.found}" for e in bad)
        )
        table.add_row(layer or "-", site, kind, eps, str(len(entries)), verdict)
    return table


def _rewrites(result) -> list[str]:
    groups: dict[tuple, list] = {}
    for r in result.rewritten:
        groups.setdefault((r.to_op, r.eps), []).append(r)
    lines = []
    for (op, eps), rewritten in groups.items():
        patterns = sorted({"+".join(dict.fromkeys(r.from_ops)) for r in rewritten})
        lines.append(
            f"rewrote {len(rewritten)} site(s) into {op}"
            + ("" if eps is None else f" eps={eps!r}")
            + f", from {' | '.join(patterns)}"
        )
    return lines


def _print_hazards(result) -> None:
    """The source's warning- and error-level hazards, as `inspect` prints them,
    and what the error-level ones did to the export."""
    from schemas.hazard_groups import group_hazards

    say_hazard_groups(group_hazards((h.layer, h.code, h.severity, h.message, False) for h in result.hazards))
    errors = result.error_hazards
    if errors and not result.written:
        say(
            f"error: {len(errors)} error-level hazard(s) in the source refuse the export; fix them, or pass --force to write it anyway.",
            style="red",
        )
    elif result.hazards:
        say(
            f"{len(result.hazards)} hazard(s) in the source (normbridge inspect shows them too); the contract compares the file "
            "with the source as it is, so it passes even when the source is not fit to serve."
        )


@app.command(name="export")
@reports_errors
def export_command(
    model_path: Path = typer.Argument(
        ...,
        metavar="MODEL",
        help="The model to export: .pt2 (torch.export), .keras (loaded with safe_mode), "
        "a Hugging Face checkpoint folder (traced on inputs its config describes), "
        "or a registry version NAME@REF (rebuilt from the registry alone).",
    ),
    to: FrameworkTarget = typer.Option(
        FrameworkTarget.onnx,
        "--to",
        help="onnx, the serving format (the layers of a registry version as torch, keras or onnx files: normbridge export-layers).",
    ),
    output: Path = typer.Option(
        ...,
        "--output",
        "-o",
        help="The .onnx file to write (atomically, and only if every check passes unless --force).",
    ),
    opset: int = typer.Option(
        23,
        "--opset",
        min=1,
        help="Highest ONNX opset the file may use (native LayerNorm >= 17, GroupNorm >= 21, RMSNorm >= 23); "
        "a graph the exporter wrote above it is converted down with onnx's version converter, or refused (exit 5).",
    ),
    no_rewrite: bool = typer.Option(
        False, "--no-rewrite", help="Keep the exporter's decomposed or folded normalizations instead of native ops."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Write the file even when verification or the contract fails or the source has an "
        "error-level hazard; the report records it.",
    ),
    sample: Path | None = typer.Option(
        None, "--sample", help="Inputs for the contract: .npy or .npz; default a seeded random batch of 4 requests."
    ),
    db: str | None = typer.Option(
        None, "--db", help="With NAME@REF: SQLAlchemy URL of the registry's metadata database (env NORMBRIDGE_DB)."
    ),
    blobs: str | None = typer.Option(
        None, "--blobs", help="With NAME@REF: the registry's blob store (env NORMBRIDGE_BLOBS)."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the export result as JSON."),
) -> None:
    """Export to ONNX for serving: verify every normalization against the source, rewrite to native ops,
    run the contract.

    The warnings and errors `inspect` reports on the model are repeated; nothing is written when a check fails or the
    model has an error-level hazard (exit 7) unless --force. MODEL may be a registry version NAME@REF (with --server
    too): it is rebuilt from the registry (blobs re-hashed, read back safely), no source file or model code needed; the
    layers of a version are written by normbridge export-layers. Example: normbridge export resnet.keras --to onnx -o
    resnet.onnx; normbridge export resnet@production --to onnx -o prod.onnx
    """
    if to is not FrameworkTarget.onnx:  # a usage error (exit 2): the option asks for something this command does not do
        raise typer.BadParameter(
            f"a model exports to onnx for serving (got {to.value}); the layers of a registry version are written "
            f"as {to.value} files by normbridge export-layers NAME@N --to {to.value} -o DIR.",
            param_hint="'--to'",
        )
    from converters.models.loading import load_model

    from_registry = "@" in str(model_path) and not model_path.exists()
    if from_registry:
        version_ref(str(model_path))
    output_path(output, suffix=".onnx")
    from converters.models.serving.export import export_for_serving
    from schemas import CheckFailedError

    check_headers(() if from_registry else (model_path,), (sample,))

    def export():
        model, answered = (
            registry_model(str(model_path), db, blobs, json_output)
            if from_registry
            else (load_model(model_path, runnable=True), None)
        )
        return export_for_serving(
            model, output, opset=opset, rewrite=not no_rewrite, force=force, sample=sample, answered=answered
        )

    try:
        if json_output:
            result = export()
        else:
            with Console(stderr=True).status(f"exporting {model_path} to {output}"):
                result = export()
    except CheckFailedError as error:
        if error.result is None:
            raise
        result = error.result
    if json_output:
        print(result.to_json())
    else:
        say(f"source:   {result.source}")
        say(f"exporter: {result.exporter}; file opset {result.opset}")
        print_table(_verification_table(result))
        for line in _rewrites(result):
            say(line)
        if result.contract is not None:
            print_contract(result.contract)
        _print_hazards(result)
        for note in result.notes:
            say(f"note: {note}")
        for message in result.errors:
            say(f"error: {message}", style="red")
        if result.written:
            console.print(
                f"[green]wrote[/] {result.path}"
                + (" [yellow](forced despite failed checks)[/]" if result.forced else "")
            )
        else:
            console.print(f"[bold red]refused[/]: nothing written to {output}")
    if not result.written:
        raise typer.Exit(_check_failed_code())


def registry_model(ref: str, db: str | None, blobs: str | None, quiet: bool):
    """(the framework object of a registry version, rebuilt from its stored structure (local, or over --server); the
    hazards its lineage answers, as the registry's servable verdict leaves them out: a recalibrated version is never
    unconverged)."""
    from registry.service.servable import ANSWERED_BY_LINEAGE
    from schemas.errors import RegistryError

    from .registry import _registry

    registry = _registry(db, blobs, quiet)
    record = registry.show(ref)
    if record.manifest.get("framework") == "onnx":
        raise RegistryError(
            f"version {record.ref} was registered as ONNX, which is already the serving format `export` writes: pull it as "
            f"it was registered with `normbridge pull {record.ref} -o FILE.onnx` (byte-identical, its sha256 checked)."
        )
    answered = {
        code: f"{record.ref} is {record.operation} (its statistics are the population statistics of its recalibration data), "
        "as its servable verdict says"
        for code in ANSWERED_BY_LINEAGE.get(record.operation, ())
    }
    from converters.adapters import REGISTRY

    model = registry.load(record.ref)  # a checkpoint folder's version: the transformers model, traced for the exporter
    return REGISTRY.model_adapter(record.manifest.get("framework", "torch")).runnable(model), answered


@app.command()
@reports_errors
def contract(
    source: Path = typer.Argument(
        ..., help="The training-framework model: .pt2 (torch.export) or .keras (loaded with safe_mode)."
    ),
    serving: Path = typer.Argument(
        ..., help="The serving model: .onnx, run with onnxruntime's CPU provider as written."
    ),
    sample: Path | None = typer.Option(
        None,
        "--sample",
        help="Inputs to replay: .npy (one input) or .npz (one array per input); default a seeded random batch.",
    ),
    batch_size: int = typer.Option(
        4, "--batch-size", help="Requests in the seeded random sample (ignored with --sample)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random sample."),
    atol: float | None = typer.Option(
        None, "--atol", help="Absolute tolerance for every float output (default float32 1e-4)."
    ),
    rtol: float | None = typer.Option(
        None, "--rtol", help="Relative tolerance for every float output (default float32 1e-3)."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the contract result as JSON."),
) -> None:
    """Check that the serving model computes what the source computes in eval mode,
    and that no request depends on its batch.

    Exit 0 when both tests pass, 7 when one fails. Example: normbridge contract model.pt2 model.onnx --sample
    requests.npz
    """
    from converters.models.serving.contract import DEFAULT_TOLERANCES, contract_test
    from converters.models.loading import load_model

    check_headers((source, serving), (sample,))
    tolerances = None
    if atol is not None or rtol is not None:
        default_atol, default_rtol = DEFAULT_TOLERANCES["float32"]
        tolerances = (default_atol if atol is None else atol, default_rtol if rtol is None else rtol)
    if json_output:
        result = contract_test(
            load_model(source), load_model(serving), sample, tolerances, batch_size=batch_size, seed=seed
        )
        print(result.to_json())
    else:
        with Console(stderr=True).status(f"replaying a sample through {source} and {serving}"):
            result = contract_test(
                load_model(source), load_model(serving), sample, tolerances, batch_size=batch_size, seed=seed
            )
        print_contract(result)
    if not result.passed:
        raise typer.Exit(_check_failed_code())
