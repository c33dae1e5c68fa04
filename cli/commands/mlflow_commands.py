"""`normbridge mlflow push|import`: move versions between the normbridge registry and an MLflow Model Registry.

A thin shell over registry.mlflow_bridge. The tracking server comes from --tracking-uri or
MLFLOW_TRACKING_URI (there is no implicit ./mlruns); --db / --blobs pick the normbridge store.
"""

from __future__ import annotations

import json

import typer
from rich.console import Console

from ..app import app, console
from ..arguments import version_ref
from ..check_summary import check_lines
from ..errors import reports_errors
from ..fitting import say, say_marked
from .registry import BLOBS_HELP, DB_HELP, _dump, _registry, _say

TRACKING_HELP = "MLflow tracking server URI, e.g. http://127.0.0.1:5000 (env MLFLOW_TRACKING_URI)."

mlflow_app = typer.Typer(
    help="Push normbridge versions to an MLflow Model Registry and import MLflow models. Example: normbridge mlflow push resnet@3 --tracking-uri http://127.0.0.1:5000",
    no_args_is_help=True,
)
app.add_typer(mlflow_app, name="mlflow")


@mlflow_app.command("push")
@reports_errors
def push(
    ref: str = typer.Argument(
        ...,
        metavar="NAME@N",
        help="The normbridge version to push (NAME@N, NAME@alias or NAME for the latest).",
        callback=version_ref,
    ),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help=TRACKING_HELP),
    name: str | None = typer.Option(
        None, "--name", help="Registered model name in MLflow (default: the normbridge model name)."
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the MLflow model version as JSON."),
) -> None:
    """Register a normbridge version in the MLflow Model Registry, with its artifact bundle and normbridge.* tags.

    The tags carry the digest, content digest, lineage (version, parent, operation), equivalence verdict and
    normalizers; pushing the same version again returns the existing MLflow version. A version registered from a .onnx,
    .keras or .pt2 file is also an MLflow model with a signature and an input example: mlflow models serve -m
    models:/NAME/N serves it. Example: normbridge mlflow push resnet@3 --tracking-uri http://127.0.0.1:5000
    """
    from registry.mlflow_bridge import push as push_version

    result = push_version(_registry(db, blobs), ref, tracking=tracking_uri, name=name)
    if json_output:
        _dump(
            {
                "created": result.created,
                "name": result.name,
                "version": result.version,
                "run_id": result.run_id,
                "source": result.source,
                "tags": result.tags,
                "mlflow_model": result.servable,
            }
        )
        return
    verb = "pushed" if result.created else "unchanged: already pushed as"
    console.print(
        f"[green]{verb}[/] {result.tags.get('normbridge.version', ref)} -> MLflow models:/{result.name}/{result.version}",
        highlight=False,
    )
    _say(f"  source      {result.source}")
    _say(f"  equivalence {result.tags.get('normbridge.equivalence', '')}")
    if result.servable:
        _say(f"  serve       mlflow models serve -m models:/{result.name}/{result.version}")


@mlflow_app.command("import")
@reports_errors
def import_(
    model_uri: str = typer.Argument(
        ..., metavar="MODEL_URI", help="MLflow model URI: runs:/RUN/PATH, models:/NAME/VERSION, models:/NAME@ALIAS."
    ),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help=TRACKING_HELP),
    name: str | None = typer.Option(
        None, "--name", help="normbridge model name (default: NAME of a models:/NAME/... URI)."
    ),
    trust_pickle: bool = typer.Option(
        False,
        "--trust-pickle",
        help="Allow loading a pickled PyTorch model (executes code from it): only for a trusted source.",
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the registered version as JSON."),
) -> None:
    """Import an MLflow-logged ONNX, Keras 3 or PyTorch (pt2) model into the registry through the equivalence gate.

    The version is recorded with operation 'imported' and a note naming the URI. Pickled PyTorch models are refused
    (exit 6) unless --trust-pickle is given. Example: normbridge mlflow import models:/resnet/2 --tracking-uri
    http://127.0.0.1:5000
    """
    from registry.mlflow_bridge import import_model

    stderr = Console(stderr=True)
    result = import_model(
        _registry(db, blobs),
        model_uri,
        tracking=tracking_uri,
        name=name,
        trust_pickle=trust_pickle,
        warn=lambda text: say(text, style="bold yellow", console=stderr),
    )
    registration = result.registration
    v = registration.version
    if json_output:
        print(
            json.dumps(
                {
                    "created": registration.created,
                    "flavor": result.flavor,
                    "model_uri": result.model_uri,
                    "version": {
                        "model": v.model,
                        "number": v.number,
                        "digest": v.digest,
                        "operation": v.operation,
                        "note": v.note,
                    },
                    "checks": [c.model_dump(mode="json") for c in registration.checks],
                },
                indent=2,
            )
        )
        return
    state = "[green]imported[/]" if registration.created else "[yellow]unchanged[/]: identical content is already"
    console.print(f"{state} {v.model}@{v.number} from {model_uri} ({result.flavor})", highlight=False)
    _say(f"  digest    {v.digest}")
    for prefix, line in check_lines(registration.checks):
        say_marked(prefix, line)
