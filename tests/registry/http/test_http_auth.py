"""Who may do what over HTTP: tokens (hashed, revocable), roles, model scopes, and --insecure-local.

Real `normbridge serve` processes and real `normbridge token create` and `revoke` processes (the other token rows run
the console script's app in this process); the database is read back with SQLAlchemy to show that only the hash of a
secret is stored.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli
from tests.http_server import create_token, running_server
from tests.registry.http.test_http_api import assert_error, bearer, onnx_bytes, pt2_bytes, small_model, snapshot

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)


def token_command(db: str, *args: str, process: bool = True) -> subprocess.CompletedProcess:
    """`normbridge token ARGS --db DB` as a real process, or in this process
    (tests.cli_run.invoke_cli) if not `process`."""
    if not process:
        return invoke_cli("token", *args, "--db", db, cwd=Path.cwd())
    return subprocess.run(
        [*normbridge_command(), "token", *args, "--db", db], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from registry.service import Registry

    root = tmp_path_factory.mktemp("http-auth")
    db, blobs = f"sqlite:///{root / 'registry.db'}", str(root / "blobs")
    tokens = {
        "admin": create_token(db, "root-admin", "admin"),
        "reader": create_token(db, "dashboard", "read"),
        "cnn_writer": create_token(db, "cnn-team", "write", models=["cnn"]),
    }
    with running_server(db=db, blobs=blobs, log=root / "serve.log") as server:
        admin = httpx.Client(base_url=server.url, headers=bearer(tokens["admin"]), timeout=180)
        assert (
            admin.post("/api/v1/models/other/versions", params={"format": "onnx"}, content=onnx_bytes()).status_code
            == 201
        )
        yield {
            "server": server,
            "db": db,
            "blobs": blobs,
            "root": root,
            "tokens": tokens,
            "admin": admin,
            "registry": Registry(db=db, blobs=blobs, user="test"),
        }
        admin.close()


def client(env, token: str | None = None) -> httpx.Client:
    return httpx.Client(base_url=env["server"].url, headers=bearer(token) if token else {}, timeout=180)


def test_requests_without_a_valid_token_are_refused_with_401(env):
    url = env["server"].url
    assert httpx.get(f"{url}/api/v1/health").json()["status"] == "ok"
    assert httpx.get(f"{url}/openapi.json").status_code == 200
    for headers in (
        {},
        {"Authorization": "Bearer nbt_000000000000_" + "a" * 43},
        {"Authorization": "Bearer garbage"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer"},
    ):
        response = httpx.get(f"{url}/api/v1/models", headers=headers)
        assert_error(response, 401, "unauthorized")
        assert response.headers["www-authenticate"] == "Bearer"
    secret_id = env["tokens"]["reader"].split("_")[1]
    wrong_secret = f"nbt_{secret_id}_{'b' * 43}"
    assert_error(httpx.get(f"{url}/api/v1/models", headers=bearer(wrong_secret)), 401, "unauthorized")
    assert_error(
        httpx.post(f"{url}/api/v1/models/x/versions", params={"format": "onnx"}, content=b"x"), 401, "unauthorized"
    )


def test_a_revoked_token_is_refused_from_then_on_and_both_events_are_audited(env):
    token = create_token(env["db"], "temp-user", "read", process=True)  # token create as a real process
    token_id = token.split("_")[1]
    with client(env, token) as c:
        assert c.get("/api/v1/models").status_code == 200
        revoked = token_command(env["db"], "revoke", token_id)
        assert revoked.returncode == 0, revoked.stderr
        assert_error(c.get("/api/v1/models"), 401, "unauthorized")
    listed = json.loads(token_command(env["db"], "list", "--json", process=False).stdout)
    entry = next(t for t in listed if t["id"] == token_id)
    assert entry["revoked_at"] is not None and "token" not in entry and token not in json.dumps(listed)
    actions = [(e.action, e.detail.get("token_id")) for e in env["registry"].audit()]
    assert ("token_create", token_id) in actions and ("token_revoke", token_id) in actions
    unknown = token_command(env["db"], "revoke", "ffffffffffff", process=False)
    assert unknown.returncode != 0 and "does not exist" in unknown.stderr


def test_tokens_are_stored_only_as_the_hash_of_their_secret(env):
    from sqlalchemy import create_engine, text

    engine = create_engine(env["db"])
    with engine.connect() as connection:
        rows = {
            row.id: row
            for row in connection.execute(text("SELECT id, secret_hash, role, owner, models FROM api_tokens"))
        }
    engine.dispose()
    database = (env["root"] / "registry.db").read_bytes() + b"".join(
        p.read_bytes() for p in env["root"].glob("registry.db-*")
    )
    for token in env["tokens"].values():
        _, token_id, secret = token.split("_", 2)
        assert rows[token_id].secret_hash == hashlib.sha256(secret.encode()).hexdigest()
        assert secret.encode() not in database
    assert json.loads(rows[env["tokens"]["cnn_writer"].split("_")[1]].models) == ["cnn"]


def test_a_read_token_cannot_write(env):
    before = snapshot(env["registry"])
    with client(env, env["tokens"]["reader"]) as reader:
        assert reader.get("/api/v1/models").status_code == 200
        assert_error(
            reader.post("/api/v1/models/other/versions", params={"format": "onnx"}, content=onnx_bytes()),
            403,
            "forbidden",
        )
        assert_error(reader.put("/api/v1/models/other/aliases/prod", json={"version": 1}), 403, "forbidden")
        assert_error(reader.post("/api/v1/gc", params={"grace": 0}), 403, "forbidden")
    assert snapshot(env["registry"]) == before


def test_a_scoped_token_sees_and_writes_only_its_models(env):
    other_version = env["admin"].get("/api/v1/models/other/versions/1").json()
    other_digest = next(iter(other_version["manifest"]["tensors"].values()))["digest"]
    with client(env, env["tokens"]["cnn_writer"]) as scoped:
        created = scoped.post(
            "/api/v1/models/cnn/versions", params={"format": "pt2"}, content=pt2_bytes(small_model(seed=9), env["root"])
        )
        assert created.status_code == 201, created.text
        assert created.json()["version"]["user"] == "cnn-team"
        assert [m["name"] for m in scoped.get("/api/v1/models").json()] == ["cnn"]
        for path in (
            "/api/v1/models/other/versions",
            "/api/v1/models/other/versions/1",
            "/api/v1/models/other/versions/1/bundle",
            "/api/v1/models/other/versions/1/lineage",
            "/api/v1/models/other/aliases",
        ):
            assert_error(scoped.get(path), 403, "forbidden")
        assert_error(scoped.get("/api/v1/diff", params={"a": "cnn@1", "b": "other@1"}), 403, "forbidden")
        assert_error(scoped.get("/api/v1/audit", params={"model": "other"}), 403, "forbidden")
        assert_error(
            scoped.post("/api/v1/models/other/versions", params={"format": "onnx"}, content=onnx_bytes()),
            403,
            "forbidden",
        )
        assert_error(scoped.get(f"/api/v1/blobs/{other_digest}"), 404, "not_found")  # existence is not revealed
        assert_error(scoped.get(f"/api/v1/blobs/{'ab' * 32}"), 404, "not_found")
        own_digest = next(iter(created.json()["version"]["manifest"]["tensors"].values()))["digest"]
        assert scoped.get(f"/api/v1/blobs/{own_digest}").status_code == 200
        not_found = assert_error(scoped.get("/api/v1/models/cnn/versions/7"), 404, "not_found")
        assert "other" not in not_found["message"]
        assert {e["model"] for e in scoped.get("/api/v1/audit").json()["entries"]} == {"cnn"}
        verified = scoped.post("/api/v1/verify", params={"check": "false"}).json()
        assert verified["versions"] == ["cnn@1"] and verified["passed"] is True
        assert_error(
            scoped.post(
                "/api/v1/models/cnn/versions",
                params={"format": "pt2", "parent": "other@1"},
                content=pt2_bytes(small_model(seed=10), env["root"]),
            ),
            403,
            "forbidden",
        )
    admin = env["admin"]
    assert admin.get(f"/api/v1/blobs/{other_digest}").status_code == 200
    child = admin.post(
        "/api/v1/models/cnn/versions",
        params={"format": "pt2", "parent": "other@1", "operation": "converted"},
        content=pt2_bytes(small_model(seed=10), env["root"]),
    )
    assert child.status_code == 201 and child.json()["version"]["parent"] == "other@1"
    assert "other@1" in admin.get("/api/v1/models/cnn/versions/2/lineage").text
    with client(env, env["tokens"]["cnn_writer"]) as scoped:
        view = scoped.get("/api/v1/models/cnn/versions/2/lineage").json()
    assert view["target"] == "cnn@2" and len(view["nodes"]) == 2 and "other" not in json.dumps(view)
    entries = env["registry"].audit(model="cnn")
    assert [(e.action, e.user) for e in entries] == [
        ("register", "cnn-team"),
        ("register", "root-admin"),
    ]  # a 403 never reaches the registry


def test_insecure_local_accepts_anonymous_callers_on_loopback_only(env, tmp_path):
    with running_server(
        db=f"sqlite:///{tmp_path / 'local.db'}",
        blobs=str(tmp_path / "blobs"),
        args=["--insecure-local", "--workers", "2"],
        log=tmp_path / "serve.log",
    ) as server:
        anonymous = httpx.post(f"{server.url}/api/v1/gc", params={"grace": 0}, timeout=60)
        assert anonymous.status_code == 200, anonymous.text
        audit = httpx.get(f"{server.url}/api/v1/audit", timeout=60).json()["entries"]
        assert [(e["action"], e["user"]) for e in audit] == [("gc", "local")]
        assert_error(
            httpx.get(f"{server.url}/api/v1/models", headers=bearer("nbt_bad"), timeout=60), 401, "unauthorized"
        )
    refused = subprocess.run(
        [
            *normbridge_command(),
            "serve",
            "--insecure-local",
            "--host",
            "0.0.0.0",
            "--port",
            "1",
            "--db",
            f"sqlite:///{tmp_path / 'x.db'}",
            "--blobs",
            str(tmp_path / "xb"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0 and "--insecure-local" in refused.stderr and "0.0.0.0" in refused.stderr
    assert not (tmp_path / "x.db").exists()


def test_a_scoped_token_never_sees_the_name_of_a_parent_outside_its_scope(env):
    """A version converted from another model's version: its parent is redacted in every JSON the scoped token can
    read."""
    admin, root = env["admin"], env["root"]
    hidden = "hidden-parent-qz"
    first = admin.post(
        f"/api/v1/models/{hidden}/versions", params={"format": "pt2"}, content=pt2_bytes(small_model(seed=21), root)
    )
    assert first.status_code == 201, first.text
    child_body = pt2_bytes(small_model(seed=22), root)
    child = admin.post(
        "/api/v1/models/derived/versions",
        params={"format": "pt2", "parent": f"{hidden}@1", "operation": "converted"},
        content=child_body,
    )
    assert child.status_code == 201 and child.json()["version"]["parent"] == f"{hidden}@1"
    assert (
        hidden in admin.get("/api/v1/models/derived/versions/1").text
    )  # the admin sees it: the redaction is per token
    token = create_token(env["db"], "derived-team", "write", models=["derived"])
    with client(env, token) as scoped:
        answers = {
            path: scoped.get(path)
            for path in (
                "/api/v1/models/derived/versions",
                "/api/v1/models/derived/versions/1",
                "/api/v1/models/derived/versions/latest",
                "/api/v1/models/derived/versions/1/lineage",
                "/api/v1/audit",
                "/api/v1/audit?model=derived",
                "/api/v1/models/derived/versions/1/bundle",
                "/api/v1/models/derived/aliases",
                "/api/v1/diff?a=derived@1&b=derived@1",
                "/api/v1/models/derived/versions/1/drift",
                "/api/v1/models/derived/versions/1/model",
            )
        }
        answers["POST verify"] = scoped.post("/api/v1/verify", params={"check": "false"})
        # the same bytes again: 200 with the existing version, whose parent is the hidden one
        answers["POST identical upload"] = scoped.post(
            "/api/v1/models/derived/versions", params={"format": "pt2"}, content=child_body
        )
    assert answers["POST identical upload"].json()["created"] is False
    for path, response in answers.items():
        assert response.status_code == 200, (path, response.text)
        assert hidden.encode() not in response.content, path
    listed = answers["/api/v1/models/derived/versions"].json()["versions"][0]
    shown = answers["/api/v1/models/derived/versions/1"].json()
    for version in (listed, shown):  # that a parent exists is kept, as in the lineage view; its name is not
        assert version["parent"] is not None and version["parent"] == version["manifest"]["lineage"]["parent"]
    lineage = answers["/api/v1/models/derived/versions/1/lineage"].json()
    assert lineage["ancestors"] == [shown["parent"]]  # one placeholder for the same hidden version everywhere
    from registry.client import RemoteRegistry

    with RemoteRegistry(
        env["server"].url, token
    ) as remote:  # the bundle still verifies: the announced digest is the one sent
        assert remote.specs("derived@1")


def test_tokens_expire_after_their_lifetime_with_a_default_and_the_list_says_so(env):
    """`token create` gives a token 90 days unless --expires says otherwise; past its time it is refused with 401 and
    listed as expired (issue 35). Time passing is simulated by moving the stored expiry into the past."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import create_engine, text

    made = {}
    for lifetime in (None, "1h", "never"):
        args = ["create", "--owner", f"expiring-{lifetime}", "--role", "read", "--json"] + (
            [] if lifetime is None else ["--expires", lifetime]
        )
        done = token_command(env["db"], *args, process=False)
        assert done.returncode == 0, done.stderr
        made[lifetime] = json.loads(done.stdout)
    now = datetime.now(UTC)
    default_expiry = datetime.fromisoformat(made[None]["expires_at"]).replace(tzinfo=UTC)
    assert abs(default_expiry - (now + timedelta(days=90))) < timedelta(minutes=5)
    assert abs(
        datetime.fromisoformat(made["1h"]["expires_at"]).replace(tzinfo=UTC) - (now + timedelta(hours=1))
    ) < timedelta(minutes=5)
    assert made["never"]["expires_at"] is None
    token = made["1h"]["token"]
    with client(env, token) as c:
        assert c.get("/api/v1/models").status_code == 200
        engine = create_engine(env["db"])
        with engine.begin() as connection:  # an hour and a minute later
            connection.execute(
                text("UPDATE api_tokens SET expires_at = :at WHERE id = :id"),
                {"at": (now - timedelta(minutes=1)).replace(tzinfo=None), "id": made["1h"]["id"]},
            )
        engine.dispose()
        assert_error(c.get("/api/v1/models"), 401, "unauthorized")
    with client(env, made["never"]["token"]) as c:
        assert c.get("/api/v1/models").status_code == 200
    listed = {t["id"]: t for t in json.loads(token_command(env["db"], "list", "--json", process=False).stdout)}
    assert listed[made["1h"]["id"]]["state"] == "expired" and listed[made["never"]["id"]]["state"] == "active"
    wrong = token_command(env["db"], "create", "--owner", "x", "--role", "read", "--expires", "5x", process=False)
    assert wrong.returncode != 0 and "not a token lifetime" in wrong.stderr
