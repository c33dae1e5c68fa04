"""`normbridge serve` (the HTTP API) and `normbridge token create|list|revoke` (its API tokens, on the server host).

Tokens are managed locally because minting one needs the database; the secret is printed once
and only its sha256 is stored.
"""

from __future__ import annotations

import json
import os

import typer
from rich.table import Table

from ..app import app, console
from ..arguments import alias_names, model_names, token_role, token_roles
from ..errors import reports_errors, stderr
from ..fitting import print_table
from .registry import BLOBS_HELP, DB_HELP

token_app = typer.Typer(
    name="token",
    no_args_is_help=True,
    help="Create, list and revoke API tokens of `normbridge serve`. Example: normbridge token create --owner alice --role write",
)
app.add_typer(token_app, name="token")


ALLOWED_HOST_HELP = (
    "Another name clients reach this server by (a DNS name, or a reverse proxy's host), optionally NAME:PORT; repeat "
    "for several. Without it only the --host address is answered (plus localhost on loopback, any IP on 0.0.0.0)."
)

GUARDED_ALIAS_HELP = (
    "An alias only a servable version may take without force=true (repeat for several; default "
    "$NORMBRIDGE_GUARDED_ALIASES, comma-separated, else production)."
)

#: Thread counts `serve` sets to 1 unless they are set: torch (OpenMP) and MKL read them when torch loads.
SINGLE_THREADED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@app.command()
@reports_errors
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 for every interface)."),
    port: int = typer.Option(8000, "--port", help="TCP port."),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    blobs: str | None = typer.Option(None, "--blobs", help=BLOBS_HELP),
    max_upload_mb: float = typer.Option(
        2048.0,
        "--max-upload-mb",
        help="Largest upload accepted, in MiB (larger ones get 413); for a bundle, its decompressed bytes, tar headers and "
        "padding included; for a .pt2 or .keras, what its zip entries unpack to.",
    ),
    insecure_local: bool = typer.Option(
        False, "--insecure-local", help="Let requests without a token act as admin 'local' (loopback hosts only)."
    ),
    workers: int = typer.Option(1, "--workers", min=1, help="Worker processes (each opens its own database pool)."),
    allowed_host: list[str] = typer.Option([], "--allowed-host", help=ALLOWED_HOST_HELP),
    guarded_alias: list[str] = typer.Option(
        [], "--guarded-alias", metavar="ALIAS", help=GUARDED_ALIAS_HELP, callback=alias_names
    ),
    no_alias_guard: bool = typer.Option(
        False, "--no-alias-guard", help="Guard no alias: any version may become production."
    ),
) -> None:
    """Serve the registry over HTTP (/api/v1, OpenAPI at /docs); every request needs a token unless --insecure-local.

    Requests whose Host is not this server's address (or an --allowed-host name), and state-changing ones sent from
    another site's page, are refused. A guarded alias (production unless --guarded-alias) refuses a version that is not
    servable with 409 not_servable unless the request says force=true. Example: normbridge serve --host 127.0.0.1 --port
    8000 --db sqlite:///registry.db --blobs ./blobs
    """
    import uvicorn

    from registry import settings
    from registry.http import app as http_app, request_guard
    from converters.gate import ChildWorkerGate
    from registry.service import Registry

    if insecure_local and not http_app.is_loopback(host):
        stderr.print(
            f"[bold red]error[/]: --insecure-local gives anonymous admin access, so it is refused on host '{host}'; "
            "use --host 127.0.0.1 or create tokens with `normbridge token create`.",
            highlight=False,
        )
        raise typer.Exit(2)
    try:
        for value in allowed_host:
            request_guard.parse_allowed_host(value)
    except ValueError as error:
        stderr.print(f"[bold red]error[/]: {error}", highlight=False)
        raise typer.Exit(2) from None
    if max_upload_mb <= 0:
        stderr.print(
            f"[bold red]error[/]: --max-upload-mb {max_upload_mb} is not positive; pass a size in MiB such as 2048.",
            highlight=False,
        )
        raise typer.Exit(2)
    limit = int(max_upload_mb * 1024 * 1024)
    # A server's parallelism is its requests and worker processes. Intra-op threads cannot speed up the gate's
    # per-layer checks (tensors of one layer), and idle ones spin on cores the requests need. Read when torch loads.
    for variable in SINGLE_THREADED:
        os.environ.setdefault(variable, "1")
    db_url, blob_uri = settings.database_url(db), settings.blobs_uri(blobs)
    guarded = [] if no_alias_guard else (guarded_alias or None)  # None: $NORMBRIDGE_GUARDED_ALIASES, else production
    # Migrations run once, before any worker; a server is long-lived: a child worker of its own checks the frameworks it
    # has not imported (no shared worker).
    registry = Registry(db=db_url, blobs=blob_uri, user="server", guarded_aliases=guarded, gate=ChildWorkerGate())
    if workers == 1:
        uvicorn.run(
            http_app.create_app(
                registry, insecure_local=insecure_local, max_upload_bytes=limit, host=host, allowed_hosts=allowed_host
            ),
            host=host,
            port=port,
            log_level="info",
        )
        return
    registry.meta.close()
    os.environ.update(
        {
            "NORMBRIDGE_DB": db_url,
            "NORMBRIDGE_BLOBS": blob_uri,
            http_app.HOST_ENV: host,
            http_app.INSECURE_ENV: "1" if insecure_local else "0",
            http_app.MAX_UPLOAD_ENV: str(limit),
            http_app.ALLOWED_HOSTS_ENV: ",".join(allowed_host),
            settings.GUARDED_ALIASES_ENV: ",".join(sorted(registry.guarded_aliases)),
        }
    )
    uvicorn.run("registry.http.app:app_from_env", factory=True, host=host, port=port, workers=workers, log_level="info")


def _tokens(db: str | None):
    from registry.metadata import MetadataStore
    from registry.settings import database_url
    from registry.tokens import TokenStore

    return TokenStore(MetadataStore(database_url(db)))


def _token_json(info) -> dict:
    return {
        "id": info.id,
        "owner": info.owner,
        "role": info.role,
        "models": None if info.models is None else list(info.models),
        "note": info.note,
        "created_at": info.created_at.isoformat(),
        "created_by": info.created_by,
        "revoked_at": None if info.revoked_at is None else info.revoked_at.isoformat(),
        "expires_at": None if info.expires_at is None else info.expires_at.isoformat(),
        "state": info.state,
    }


@token_app.command("create")
@reports_errors
def token_create(
    owner: str = typer.Option(..., "--owner", help="Who the token acts as (named in the audit log)."),
    role: str = typer.Option(
        ...,
        "--role",
        help="read, write (implies read) or admin (implies write).",
        callback=token_role,
        autocompletion=token_roles,
    ),
    model: list[str] = typer.Option(
        [],
        "--model",
        help="Restrict the token to this model (repeat for several; default every model).",
        callback=model_names,
    ),
    note: str | None = typer.Option(None, "--note", help="Why the token exists."),
    expires: str = typer.Option(
        "90d",
        "--expires",
        metavar="30d|12h|never",
        help="How long the token lives: days (30d), hours (12h) or never; requests with it then get 401.",
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    json_output: bool = typer.Option(
        False, "--json", help="Print {id, token, owner, role, models, expires_at} as JSON."
    ),
) -> None:
    """Create an API token and print its secret once (only its hash is stored). Example: normbridge token create --owner
    ci --role write --model resnet --expires 30d"""
    from registry.settings import current_user
    from registry.tokens import parse_lifetime

    info, token = _tokens(db).create(
        owner, role, models=model or None, note=note, created_by=current_user(), lifetime=parse_lifetime(expires)
    )
    expiry = "never expires" if info.expires_at is None else f"expires {info.expires_at.strftime('%Y-%m-%d %H:%M UTC')}"
    if json_output:
        print(
            json.dumps(
                {
                    "id": info.id,
                    "token": token,
                    "owner": info.owner,
                    "role": info.role,
                    "models": None if info.models is None else list(info.models),
                    "expires_at": None if info.expires_at is None else info.expires_at.isoformat(),
                }
            )
        )
        return
    print(token)
    scope = ", ".join(info.models) if info.models else "every model"
    console.print(
        f"token {info.id} for {info.owner}: role {info.role}, {scope}, {expiry}. It is shown only this once: store it now.",
        highlight=False,
    )


@token_app.command("list")
@reports_errors
def token_list(
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the tokens as JSON (never their secrets)."),
) -> None:
    """List API tokens (ids, owners, roles, scopes, expiry and state; never secrets). Example:
    normbridge token list --json"""
    tokens = _tokens(db).list()
    if json_output:
        print(json.dumps([_token_json(t) for t in tokens], indent=2))
        return
    table = Table(title=f"{len(tokens)} token(s)")
    for column in ("id", "owner", "role", "models", "created", "by", "expires", "state", "note"):
        table.add_column(column, overflow="fold")
    for t in tokens:
        table.add_row(
            t.id,
            t.owner,
            t.role,
            ", ".join(t.models) if t.models else "all",
            t.created_at.strftime("%Y-%m-%d %H:%M"),
            t.created_by,
            "never" if t.expires_at is None else t.expires_at.strftime("%Y-%m-%d %H:%M"),
            t.state,
            t.note or "",
        )
    print_table(table)


@token_app.command("revoke")
@reports_errors
def token_revoke(
    token_id: str = typer.Argument(
        ..., metavar="ID", help="The token id (12 hex digits, from `normbridge token list`)."
    ),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the revoked token as JSON."),
) -> None:
    """Revoke an API token from now on; requests with it get 401. Example: normbridge token revoke 3f9a0c1b2d4e"""
    from registry.settings import current_user

    info = _tokens(db).revoke(token_id, user=current_user())
    if json_output:
        print(json.dumps(_token_json(info)))
        return
    console.print(f"token {info.id} of {info.owner} is revoked", highlight=False)
