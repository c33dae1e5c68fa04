"""Registry commands: register model versions behind the equivalence gate, read, diff, trace lineage, verify, audit, gc
(export-layers: cli/commands/layer_export.py).

Every command is a thin shell over registry.service.Registry. `--db` / `--blobs` (or env
NORMBRIDGE_DB / NORMBRIDGE_BLOBS) pick the store; by default SQLite and a blobs folder under
$NORMBRIDGE_HOME (~/.local/share/normbridge), created on first use. With the global
`--server URL` (env NORMBRIDGE_SERVER) the same commands run against a `normbridge serve`
server through registry.client.RemoteRegistry (cli/remote.py), with byte progress bars.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table
from rich.tree import Tree

from .. import arguments, remote
from ..app import app, console
from ..check_summary import check_lines
from ..arguments import model_name, version_ref
from ..errors import reports_errors
from ..fitting import clipped, print_table, say, say_marked

# the other command modules import them from here
from ..registry_access import BLOBS_HELP, DB_HELP, _dump, _register, _registry  # noqa: F401
from ..servable_text import say_registered_verdict, say_verdict, servable_cell

INTEGRITY_EXIT = 12
#: Characters of an audit entry's detail the table shows (a refusal's message can run to several sentences).
AUDIT_DETAIL_CHARS = 120


def _say(text: str, style: str | None = None) -> None:
    say(text, style=style)


def _when(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S")


@app.command()
@reports_errors
def register(
    name: str = typer.Argument(
        ..., metavar="NAME", help="Model name (letters, digits, '.', '_', '-').", callback=model_name
    ),
    model: Path = typer.Argument(
        ..., metavar="MODEL", help="The model: .pt2, .keras (safe_mode), .onnx, or a saved artifact folder."
    ),
    parent: str | None = typer.Option(
        None,
        "--parent",
        metavar="NAME@N",
        callback=version_ref,
        help="Parent version NAME@N (default: the latest version of NAME, if any).",
    ),
    note: str | None = typer.Option(None, "--note", help="A free-text note stored with the version."),
    operation: str | None = typer.Option(
        None,
        "--operation",
        help="Lineage label: registered (from scratch: no parent unless --parent), "
        "fine-tuned (the default after a first version), recalibrated, converted, imported.",
        callback=arguments.operation,
    ),
    no_parent: bool = typer.Option(
        False,
        "--no-parent",
        help="The model was made from scratch (retrained), not from the latest "
        "version: record no parent (the same as --operation registered).",
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    allow_unrecognised: bool = typer.Option(
        False,
        "--allow-unrecognised",
        help="Register a model holding layers that look like normalizations and that no recognizer "
        "proved (or no normalization at all); they are recorded as unchecked in the manifest "
        "and the audit log.",
    ),
    json_output: bool = typer.Option(
        False,
        "--json",
        help="Print the registered version as JSON, with its checks and the seconds each step took (reading, gate, staging, commit; none over a server).",
    ),
) -> None:
    """Register MODEL as the next version of NAME, only if every normalization layer passes the round-trip check.

    Nothing is stored when a check fails (exit 7) or when the model holds normalization no recognizer proved (exit 21,
    unless --allow-unrecognised); identical content returns the existing version. The checks on frameworks the model
    does not use run in a shared worker process that stays up for the next registration (NORMBRIDGE_WORKER_IDLE, 600 s;
    NORMBRIDGE_GATE_WORKER=private: one per command); into a local registry, a registration that finds it running is run
    there whole (NORMBRIDGE_REGISTER_IN_WORKER=0: here). Example: normbridge register resnet resnet.pt2 --note "epoch 3"
    """
    if no_parent and (parent is not None or operation not in (None, "registered")):
        raise typer.BadParameter(
            f"--no-parent records a version made from scratch; it cannot go with "
            f"{'--parent ' + parent if parent else '--operation ' + str(operation)}.",
            param_hint="--no-parent",
        )
    operation = "registered" if no_parent else operation
    options = {"parent": parent, "note": note, "operation": operation, "allow_unrecognised": allow_unrecognised}
    if json_output or remote.options.server is not None:  # over a server the upload draws a byte bar instead of steps
        result = _register(name, model, db, blobs, json_output, None, options)
    else:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            console=Console(stderr=True),
            transient=True,
            disable=not Console(stderr=True).is_terminal,
        ) as bar:
            task = bar.add_task(f"registering {name}", total=1)

            def progress(step: str, done: int, total: int) -> None:
                bar.update(task, description=f"{name}: {step}", completed=done, total=max(total, 1))

            result = _register(name, model, db, blobs, json_output, progress, options)
    v = result.version
    if json_output:
        _dump(
            {
                "created": result.created,
                "version": v,
                "note_stored": result.created or note in (None, v.note),
                "checks": [c.model_dump(mode="json") for c in result.checks],
                "unrecognised": [u.model_dump(mode="json") for u in result.unrecognised],
                "seconds": result.seconds,
            }
        )
        return
    if result.created:
        console.print(f"[green]registered[/] {v.model}@{v.number}", highlight=False)
    else:
        console.print(
            f"[yellow]unchanged[/]: identical content is already {v.model}@{v.number}; nothing new stored",
            highlight=False,
        )
        if note is not None and note != v.note:
            _say(
                f"  the note was not stored: {v.model}@{v.number} keeps its own ({v.note!r})"
                if v.note
                else f"  the note was not stored: {v.model}@{v.number} has none, and a version does not change once registered"
            )
    _say(f"  operation {v.operation}" + (f" from {v.parent}" if v.parent else ""))
    _say(f"  digest    {v.digest}")
    for prefix, line in check_lines(result.checks) if result.checks else []:
        say_marked(prefix, line)
    if result.unrecognised:
        say_marked(
            "  [yellow]unchecked[/] ",
            f"{len(result.unrecognised)} (--allow-unrecognised): " + ", ".join(u.path for u in result.unrecognised),
        )
    say_registered_verdict(v)


@app.command()
@reports_errors
def models(
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the models as JSON."),
) -> None:
    """List registered models with their latest version. Example: normbridge models --json"""
    rows = _registry(db, blobs, json_output).models()
    if json_output:
        _dump([{"name": n, "latest": latest, "versions": count} for n, latest, count in rows])
        return
    table = Table(title=f"{len(rows)} model(s)")
    for column, justify in (("model", "left"), ("latest", "right"), ("versions", "right")):
        table.add_column(column, justify=justify)
    for n, latest, count in rows:
        table.add_row(n, str(latest), str(count))
    print_table(table)


@app.command()
@reports_errors
def versions(
    name: str = typer.Argument(..., metavar="NAME", help="Model name.", callback=model_name),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the versions as JSON."),
) -> None:
    """List the versions of a model, oldest first, with lineage, aliases and whether each may serve. Example:
    normbridge versions resnet"""
    registry = _registry(db, blobs, json_output)
    records = registry.versions(name)
    aliases = registry.aliases(name)
    if json_output:
        _dump({"versions": records, "aliases": aliases})
        return
    by_number: dict[int, list[str]] = {}
    for a in aliases:
        by_number.setdefault(a.number, []).append(a.alias)
    table = Table(title=f"{name}: {len(records)} version(s)")
    for column in ("version", "created", "user", "operation", "parent", "digest", "aliases", "servable", "note"):
        table.add_column(column, overflow="fold")
    for r in records:
        table.add_row(
            str(r.number),
            _when(r.created_at),
            r.user,
            r.operation,
            r.parent or "-",
            r.digest[:12],
            ", ".join(by_number.get(r.number, [])) or "-",
            servable_cell(r),
            r.note or "",
        )
    print_table(table)


def _stats(array) -> str:
    if array is None:
        return "-"
    return f"{float(array.min()):.4g} / {float(array.mean()):.4g} / {float(array.max()):.4g}"


@app.command()
@reports_errors
def show(
    ref: str = typer.Argument(
        ..., metavar="NAME@N", help="A version: NAME@N, NAME@alias or NAME (latest).", callback=version_ref
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the version and its manifest as JSON."),
) -> None:
    """Show a version: whether it may serve and why, its normalization layers
    (specs, modes, statistics summary) and the equivalence report.

    Every blob is re-hashed before its statistics are shown (exit 12 if tampered); --json carries "servable" and
    "hazards". Example: normbridge show resnet@2
    """
    registry = _registry(db, blobs, json_output)
    record = registry.show(ref)
    specs = registry.specs(f"{record.model}@{record.number}")
    if json_output:
        _dump(record)
        return
    manifest = record.manifest
    _say(
        f"{record.model}@{record.number}  {manifest.get('framework')} {manifest.get('format')}, mode {manifest.get('mode')}"
    )
    _say(
        f"created {_when(record.created_at)} by {record.user}; {record.operation}"
        + (f" from {record.parent}" if record.parent else "")
    )
    _say(f"digest {record.digest}")
    if record.note:
        _say(f"note: {record.note}")
    say_verdict(record)
    equivalence = manifest.get("equivalence") or []
    table = Table(title=f"{len(specs)} normalization layer(s), {len(manifest.get('tensors', {}))} tensor(s)")
    for column in (
        "layer",
        "kind",
        "features",
        "eps",
        "momentum",
        "mode",
        "running_mean min/mean/max",
        "running_var min/mean/max",
        "check",
    ):
        table.add_column(column, overflow="fold")
    for i, (entry, spec) in enumerate(zip(manifest.get("normalizers", []), specs)):
        check = equivalence[i] if i < len(equivalence) else None
        verdict = "-" if check is None else ("[green]passed[/]" if check.get("passed") else "[bold red]FAILED[/]")
        momentum = "-" if getattr(spec, "momentum", None) is None else f"{spec.momentum} ({spec.momentum_convention})"
        table.add_row(
            entry.get("path", spec.name),
            spec.kind,
            str(spec.num_features or spec.normalized_shape or "-"),
            repr(spec.eps),
            momentum,
            "train" if spec.training else "eval",
            _stats(spec.tensors.get("running_mean")),
            _stats(spec.tensors.get("running_var")),
            verdict,
        )
    print_table(table)


@app.command()
@reports_errors
def diff(
    ref_a: str = typer.Argument(..., metavar="NAME@A", help="The older version.", callback=version_ref),
    ref_b: str = typer.Argument(..., metavar="NAME@B", help="The newer version.", callback=version_ref),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the diff as JSON."),
) -> None:
    """Compare two versions: per tensor unchanged/changed (max abs and relative change), per normalizer config,
    and a headline.

    Example: normbridge diff resnet@1 resnet@2
    """
    result = _registry(db, blobs, json_output).diff(ref_a, ref_b)
    if json_output:
        print(result.to_json())
        return
    _say(result.render_text())


@app.command()
@reports_errors
def lineage(
    ref: str = typer.Argument(
        ..., metavar="NAME@N", help="A version: NAME@N, NAME@alias or NAME (latest).", callback=version_ref
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the lineage as JSON."),
) -> None:
    """Show a version's ancestors and descendants as a tree with operation labels. Example:
    normbridge lineage resnet@2"""
    view = _registry(db, blobs, json_output).lineage(ref)
    if json_output:
        print(view.model_dump_json(indent=2))
        return
    rich_tree = getattr(view, "rich_tree", None) or getattr(view, "to_rich", None)
    rendered = rich_tree() if callable(rich_tree) else None
    if isinstance(rendered, Tree):
        console.print(rendered)
    else:
        _say(view.render_text())


@app.command()
@reports_errors
def verify(
    ref: str | None = typer.Argument(
        None, metavar="NAME@N", help="One version; default every version of every model.", callback=version_ref
    ),
    no_check: bool = typer.Option(
        False, "--no-check", help="Only re-hash the blobs; skip re-running the equivalence check."
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the verification result as JSON."),
) -> None:
    """Re-hash every blob, re-run the equivalence check and verify the audit hash chain.

    Exit 0 when all is intact, 12 when a blob is tampered or missing or the chain is broken, 7 when a check fails.
    Example: normbridge verify resnet@2
    """
    result = _registry(db, blobs, json_output).verify(ref, rerun_checks=not no_check)
    if json_output:
        print(result.to_json())
    else:
        _say(result.render_text(), style=None if result.passed else "red")
    if any(p.kind in ("blob", "audit") for p in result.problems):
        raise typer.Exit(INTEGRITY_EXIT)
    if result.problems:
        from schemas.errors import CheckFailedError, exit_code_for

        raise typer.Exit(exit_code_for(CheckFailedError("check failed")))


@app.command()
@reports_errors
def alias(
    name: str = typer.Argument(..., metavar="NAME", help="Model name.", callback=model_name),
    alias_name: str = typer.Argument(
        ..., metavar="ALIAS", help="Alias to set or move, e.g. production.", callback=arguments.alias_name
    ),
    ref: str = typer.Argument(
        ..., metavar="NAME@N", help="The version it points at from now on (NAME@N, or N).", callback=version_ref
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Move a guarded alias (production) to a version that is not servable anyway; "
        "the audit entry records that it was forced and what it overrode.",
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the alias record as JSON."),
) -> None:
    """Point NAME@ALIAS at a version; every move is recorded in the audit log.

    A guarded alias (production, or those in NORMBRIDGE_GUARDED_ALIASES) refuses a version that is not servable, naming
    why (exit 22), unless --force. Example: normbridge alias resnet production resnet@2
    """
    record = _registry(db, blobs, json_output).set_alias(name, alias_name, ref, force=force)
    if json_output:
        _dump(record)
        return
    console.print(f"[green]{record.model}@{record.alias}[/] -> {record.model}@{record.number}", highlight=False)


def _short(value) -> str:
    """Digests shortened to 12 hex digits, as git shows them; other values as they are."""
    text = str(value)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


@app.command()
@reports_errors
def audit(
    model: str | None = typer.Option(None, "--model", help="Only entries of this model.", callback=model_name),
    user: str | None = typer.Option(None, "--user", help="Only entries by this user."),
    verify_chain: bool = typer.Option(
        False, "--verify", help="Verify the hash chain of the whole log and its head (exit 12 if broken)."
    ),
    expect_head: str | None = typer.Option(
        None,
        "--expect-head",
        metavar="HASH",
        help="A head printed by an earlier --verify: it must still be in the log (implies --verify).",
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the entries as JSON."),
) -> None:
    """Print the append-only audit log (registrations, failures, alias moves, deletions).

    --verify also checks that the log ends at its head and prints the head; keep that hash outside the registry
    and pass it back with --expect-head to detect entries cut from the end even when the head was rewritten too.
    Example: normbridge audit --verify --expect-head 3f1c...
    """
    from registry.audit_chain import check_pinned_head

    pinned = None if expect_head is None else check_pinned_head(expect_head)
    registry = _registry(db, blobs, json_output)
    entries = registry.audit(model=model, user=user)
    check = registry.check_audit(pinned) if verify_chain or pinned is not None else None
    problems = None if check is None else check.problems
    if json_output:
        verified = (
            {}
            if check is None
            else {
                "chain_problems": problems,
                "chain_ok": not problems,
                "head": None if check.head is None else dataclasses.asdict(check.head),
            }
        )
        _dump({"entries": entries, **verified})
    else:
        table = Table(title=f"audit log: {len(entries)} entries")
        for column in ("seq", "at", "user", "action", "version", "detail", "hash"):
            table.add_column(column, overflow="fold")
        for e in entries:
            where = "-" if e.model is None else (e.model if e.number is None else f"{e.model}@{e.number}")
            detail = e.detail.get("message") or ", ".join(
                f"{k}={_short(v)}" for k, v in e.detail.items() if not isinstance(v, (dict, list))
            )
            table.add_row(
                str(e.seq), _when(e.at), e.user, e.action, where, clipped(detail, AUDIT_DETAIL_CHARS), e.hash[:12]
            )
        print_table(table)
        if check is not None:
            _say_chain(check)
    if problems:
        raise typer.Exit(INTEGRITY_EXIT)


def _say_chain(check) -> None:
    """The verdict on the chain, and the head to pin (what `--expect-head` takes back)."""
    for problem in check.problems:
        _say(f"chain broken: {problem}", style="red")
    if not check.problems:
        console.print("[green]hash chain intact[/], ending at its head")
    if check.head is not None:
        _say(f"audit head: entry {check.head.seq}, hash {check.head.hash}")
        if not check.problems:
            _say(f"pin it outside the registry; later: normbridge audit --verify --expect-head {check.head.hash}")


@app.command()
@reports_errors
def gc(
    grace: float = typer.Option(
        3600.0,
        "--grace",
        min=0.0,
        help="Keep unreferenced blobs younger than this many seconds (a registration may be in flight).",
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print what was deleted as JSON."),
) -> None:
    """Delete blobs that no version references (left by an interrupted registration) and no registration in flight
    relies on.

    A registration leases its blobs until it commits, so gc may run beside `normbridge serve`; a crashed one's lease
    lapses after a day. Example: normbridge gc --grace 0
    """
    result = _registry(db, blobs, json_output).gc(grace)
    if json_output:
        print(result.to_json())
        return
    _say(
        f"deleted {len(result.deleted)} unreferenced blob(s), {result.bytes_freed} bytes; kept {len(result.kept_young)} younger than "
        f"{result.grace_seconds:g} s and {len(result.kept_in_flight)} leased by registrations in flight; "
        f"{result.referenced} blob(s) referenced by versions"
    )
