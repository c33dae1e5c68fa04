"""The HTTP API over a real `normbridge serve` (uvicorn on loopback, SQLite, a blob folder), spoken to with httpx.

One server for the module (upload limit 1 MiB); models are built in code (a torch Linear + BatchNorm1d
exported to .pt2, an ONNX BatchNormalization, artifact bundles). What the server stored is read back
with the registry library on the same database, so "nothing stored" is checked where it lives.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from pathlib import Path

import httpx
import pytest
import torch

from tests.http_server import create_token, running_server

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

UPLOAD_LIMIT = 1024 * 1024


# -- models built in code ----------------------------------------------------------------------


def small_model(seed: int = 0, shift: float = 0.0) -> torch.nn.Module:
    """Linear + BatchNorm1d whose running statistics moved in three train-mode forwards."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4, eps=1e-3))
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 3) + shift)
    return model.eval()


def pt2_bytes(model: torch.nn.Module, folder: Path) -> bytes:
    path = folder / f"model-{os.urandom(4).hex()}.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 3),)), str(path))
    return path.read_bytes()


def onnx_bytes() -> bytes:
    import converters

    bn = torch.nn.BatchNorm2d(3, eps=1e-4).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return converters.convert(bn, to="onnx").SerializeToString()


def tar_folder(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=str(path.relative_to(folder)))
    return buffer.getvalue()


def bundle_of(model, folder: Path) -> bytes:
    from registry.artifact import extract_artifact
    from registry.manifest_io import save_artifact_folder

    return tar_folder(save_artifact_folder(extract_artifact(model), folder / f"artifact-{os.urandom(4).hex()}"))


def failing_gate_bundle(folder: Path) -> bytes:
    """A float16 BatchNorm whose outputs overflow float16: a valid spec that genuinely fails the equivalence check."""
    bn = torch.nn.Sequential(torch.nn.BatchNorm1d(4)).half().eval()
    with torch.no_grad():
        bn[0].running_var.fill_(1e-7)
        bn[0].weight.fill_(1000.0)
    return bundle_of(bn, folder)


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def snapshot(registry) -> dict:
    """What a refused request must leave unchanged: versions and blobs."""
    return {
        "versions": [
            (r.model, r.number, r.digest) for name, _, _ in registry.models() for r in registry.meta.versions(name)
        ],
        "blobs": sorted(registry.store.digests()),
    }


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "layer", "setting", "report"}, body
    assert body["error"]["code"] == code and len(body["error"]["message"]) > 20, body
    return body["error"]


# -- one server for the module --------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from registry.service import Registry

    root = tmp_path_factory.mktemp("http-api")
    db, blobs = f"sqlite:///{root / 'registry.db'}", str(root / "blobs")
    tokens = {
        "admin": create_token(db, "root-admin", "admin"),
        "writer": create_token(db, "ci-bot", "write"),
        "reader": create_token(db, "dashboard", "read"),
    }
    with running_server(db=db, blobs=blobs, args=["--max-upload-mb", "1"], log=root / "serve.log") as server:
        clients = {
            role: httpx.Client(base_url=server.url, headers=bearer(t), timeout=180) for role, t in tokens.items()
        }
        try:
            yield {
                "server": server,
                "clients": clients,
                "root": root,
                "registry": Registry(db=db, blobs=blobs, user="test"),
            }
        finally:
            for client in clients.values():
                client.close()


@pytest.fixture(scope="module")
def registered(env):
    """cnn@1 and cnn@2 (statistics fine-tuned) registered over HTTP by the write token."""
    writer, root = env["clients"]["writer"], env["root"]
    model = small_model()
    first = writer.post(
        "/api/v1/models/cnn/versions", params={"format": "pt2", "note": "3 steps"}, content=pt2_bytes(model, root)
    )
    again = writer.post("/api/v1/models/cnn/versions", params={"format": "pt2"}, content=pt2_bytes(model, root))
    with torch.no_grad():
        model.train()
        model(torch.randn(16, 3) * 2 + 1)
        model.eval()
    second = writer.post("/api/v1/models/cnn/versions", params={"format": "pt2"}, content=pt2_bytes(model, root))
    return first, again, second


# -- tests ----------------------------------------------------------------------------------------


def test_upload_registers_201_then_200_for_identical_content_and_every_read_works(env, registered):
    first, again, second = registered
    assert first.status_code == 201, first.text
    v1 = first.json()
    assert v1["created"] is True and v1["version"]["number"] == 1 and v1["version"]["user"] == "ci-bot"
    assert v1["version"]["note"] == "3 steps" and [c["passed"] for c in v1["checks"]] == [True]
    assert again.status_code == 200 and again.json()["created"] is False and again.json()["version"]["number"] == 1
    assert second.status_code == 201 and second.json()["version"]["parent"] == "cnn@1"
    assert second.json()["version"]["operation"] == "fine-tuned"

    reader = env["clients"]["reader"]
    assert reader.get("/api/v1/models").json() == [{"name": "cnn", "latest": 2, "versions": 2}]
    listing = reader.get("/api/v1/models/cnn/versions").json()
    assert [v["number"] for v in listing["versions"]] == [1, 2] and listing["aliases"] == []
    shown = reader.get("/api/v1/models/cnn/versions/1").json()
    assert shown["digest"] == v1["version"]["digest"] and shown["created_at"].endswith(("Z", "+00:00"))
    assert reader.get("/api/v1/models/cnn/versions/latest").json()["number"] == 2

    alias = env["clients"]["writer"].put("/api/v1/models/cnn/aliases/production", json={"version": "cnn@1"})
    assert alias.status_code == 200 and alias.json()["number"] == 1 and alias.json()["user"] == "ci-bot"
    assert (
        env["clients"]["writer"].put("/api/v1/models/cnn/aliases/production", json={"version": 2}).json()["number"] == 2
    )
    assert reader.get("/api/v1/models/cnn/versions/production").json()["number"] == 2
    assert [a["alias"] for a in reader.get("/api/v1/models/cnn/aliases").json()] == ["production"]

    lineage = reader.get("/api/v1/models/cnn/versions/1/lineage")
    assert lineage.status_code == 200 and "cnn@2" in lineage.text and "fine-tuned" in lineage.text
    diff = reader.get("/api/v1/diff", params={"a": "cnn@1", "b": "cnn@2"})
    assert diff.status_code == 200, diff.text
    from schemas.manifest_diff import ManifestDiff

    assert "running statistics changed" in ManifestDiff.model_validate(diff.json()).render_text()

    audit = reader.get("/api/v1/audit", params={"model": "cnn", "verify": "true"}).json()
    assert audit["chain_ok"] is True and audit["chain_problems"] == []
    assert audit["head"] == {
        "seq": audit["entries"][-1]["seq"],
        "hash": audit["entries"][-1]["hash"],
    }  # cnn's entries are the last
    pinned = reader.get("/api/v1/audit", params={"expect_head": audit["head"]["hash"]}).json()
    assert pinned["chain_ok"] is True and pinned["head"] == audit["head"]
    forged = reader.get("/api/v1/audit", params={"expect_head": "ab" * 32}).json()
    assert forged["chain_ok"] is False and forged["chain_problems"][0].startswith(
        "the pinned audit head abababababab..."
    )
    assert reader.get("/api/v1/audit", params={"expect_head": "abc"}).status_code == 422
    assert [(e["action"], e["user"]) for e in audit["entries"]] == [
        ("register", "ci-bot"),
        ("register_existing", "ci-bot"),
        ("register", "ci-bot"),
        ("alias", "ci-bot"),
        ("alias", "ci-bot"),
    ]
    assert reader.get("/api/v1/audit", params={"user": "nobody"}).json()["entries"] == []
    assert reader.get("/api/v1/models/cnn/versions/2/drift").json()["reports"] == []


def test_onnx_upload_and_bundle_download_round_trip(env, registered):
    from registry.manifest_io import load_artifact_folder

    writer, reader, root = env["clients"]["writer"], env["clients"]["reader"], env["root"]
    created = writer.post("/api/v1/models/bn-onnx/versions", params={"format": "onnx"}, content=onnx_bytes())
    assert created.status_code == 201, created.text

    response = reader.get("/api/v1/models/cnn/versions/2/bundle")
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-tar"
    version = reader.get("/api/v1/models/cnn/versions/2").json()
    assert response.headers["x-normbridge-version"] == "cnn@2"
    assert response.headers["x-normbridge-digest"] == version["digest"]
    assert int(response.headers["content-length"]) == len(response.content)
    target = root / "downloaded"
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        names = tar.getnames()
        tar.extractall(target, filter="data")
    parts = (version["manifest"].get("structure") or {}).get(
        "parts", {}
    )  # the model's structure travels with its tensors
    assert parts, "a .pt2 version holds its structure"
    digests = sorted(
        {t["digest"] for t in version["manifest"]["tensors"].values()} | {p["digest"] for p in parts.values()}
    )
    assert sorted(names) == sorted(["manifest.json", *[f"blobs/{d}.safetensors" for d in digests]])
    artifact = load_artifact_folder(target)  # re-hashes every blob and re-validates every spec
    assert artifact.manifest.digest() == version["digest"]

    blob = reader.get(f"/api/v1/blobs/{digests[0]}")
    assert blob.status_code == 200 and blob.headers["x-normbridge-sha256"] == digests[0]
    assert blob.content == (target / "blobs" / f"{digests[0]}.safetensors").read_bytes()
    assert_error(reader.get(f"/api/v1/blobs/{'0' * 64}"), 404, "not_found")
    assert_error(reader.get("/api/v1/blobs/not-a-digest"), 404, "not_found")

    imported = writer.post("/api/v1/models/cnn-copy/versions", params={"format": "bundle"}, content=response.content)
    assert imported.status_code == 201, imported.text
    assert imported.json()["version"]["operation"] == "imported"
    assert imported.json()["version"]["content_digest"] == version["content_digest"]


def test_a_failing_gate_returns_the_error_with_its_report_and_stores_nothing(env, registered):
    writer, registry, root = env["clients"]["writer"], env["registry"], env["root"]
    before = snapshot(registry)
    failed = writer.post("/api/v1/models/cnn/versions", params={"format": "bundle"}, content=failing_gate_bundle(root))
    error = assert_error(failed, 409, "check_failed")
    assert "failed the round-trip equivalence check" in error["message"]
    assert error["report"]["passed"] is False and error["report"]["kind"] == "batch"
    assert snapshot(registry) == before

    nan_model = small_model(seed=4)
    with torch.no_grad():
        nan_model[1].running_var[2] = float("nan")
    refused = writer.post("/api/v1/models/cnn/versions", params={"format": "pt2"}, content=pt2_bytes(nan_model, root))
    error = assert_error(refused, 422, "invalid_spec")
    assert "1" in (error["layer"] or "") and error["report"] is None
    assert_error(
        writer.post("/api/v1/models/cnn/versions", params={"format": "onnx"}, content=b"not an onnx file at all"),
        400,
        "bad_input_file",
    )
    assert snapshot(registry) == before
    failures = [e for e in registry.audit(model="cnn") if e.action == "register_failed"]
    assert [(e.user, e.detail["error"]) for e in failures][-3:] == [
        ("ci-bot", "check_failed"),
        ("ci-bot", "invalid_spec"),
        ("ci-bot", "bad_input_file"),
    ]
    # an error about the uploaded file names it as such, never by the server's temporary path
    truncated = pt2_bytes(small_model(seed=5), root)[:3000]
    error = assert_error(
        writer.post("/api/v1/models/cnn/versions", params={"format": "pt2"}, content=truncated), 400, "bad_input_file"
    )
    assert error["message"].startswith("the uploaded .pt2 file ") and tempfile.gettempdir() not in error["message"], (
        error
    )


def test_an_upload_over_the_limit_is_refused_with_413_and_stores_nothing(env, registered):
    writer, registry = env["clients"]["writer"], env["registry"]
    before, audit_before = snapshot(registry), len(registry.audit())
    body = os.urandom(UPLOAD_LIMIT + 4096)
    assert_error(
        writer.post("/api/v1/models/cnn/versions", params={"format": "onnx"}, content=body), 413, "payload_too_large"
    )

    def chunks():  # no Content-Length: the limit is enforced while streaming
        for start in range(0, len(body), 64 * 1024):
            yield body[start : start + 64 * 1024]

    assert_error(
        writer.post("/api/v1/models/cnn/versions", params={"format": "pt2"}, content=chunks()), 413, "payload_too_large"
    )
    huge = writer.post("/api/v1/models/cnn/versions", params={"format": "pt2"}, content=b"x" * (40 * 1024 * 1024))
    assert_error(huge, 413, "payload_too_large")
    assert snapshot(registry) == before and len(registry.audit()) == audit_before


def test_an_over_limit_body_of_zeros_is_refused_as_too_large_not_as_unreadable(env, registered):
    """Zeros are a tar's end-of-archive marker: the size must decide before the format is read (2 MiB against 1 MiB)."""
    writer, registry = env["clients"]["writer"], env["registry"]
    before, audit_before = snapshot(registry), len(registry.audit())
    zeros = b"\0" * (2 * UPLOAD_LIMIT)

    def chunks():  # no Content-Length: only counting while it streams can tell
        for start in range(0, len(zeros), 64 * 1024):
            yield zeros[start : start + 64 * 1024]

    for file_format in ("bundle", "onnx", "pt2", "keras"):
        assert_error(
            writer.post("/api/v1/models/cnn/versions", params={"format": file_format}, content=zeros),
            413,
            "payload_too_large",
        )
        assert_error(
            writer.post("/api/v1/models/cnn/versions", params={"format": file_format}, content=chunks()),
            413,
            "payload_too_large",
        )
    # a whole, valid bundle followed by padding past the limit is refused too:
    # it is registered only once all of it arrived
    padded = bundle_of(small_model(seed=31), env["root"]) + zeros
    assert_error(
        writer.post("/api/v1/models/cnn/versions", params={"format": "bundle"}, content=padded),
        413,
        "payload_too_large",
    )
    assert snapshot(registry) == before and len(registry.audit()) == audit_before


def test_every_response_carries_nosniff(env, registered):
    reader, writer = env["clients"]["reader"], env["clients"]["writer"]
    url = env["server"].url
    responses = [
        httpx.get(f"{url}/api/v1/models", timeout=30),  # 401
        reader.post("/api/v1/gc"),  # 403
        reader.get("/api/v1/models/cnn/versions/9"),  # 404
        reader.delete("/api/v1/models"),  # 405
        writer.post("/api/v1/models/cnn/versions", params={"format": "onnx"}, content=b"x" * (UPLOAD_LIMIT + 1)),  # 413
        writer.post("/api/v1/gc", headers={"Content-Type": "text/plain"}),  # 415
        reader.get("/api/v1/diff", params={"a": "cnn@1"}),  # 422
        writer.post("/api/v1/models/cnn/versions", params={"format": "onnx"}, content=b"not onnx"),  # 400
        reader.get("/api/v1/models"),
        reader.get("/api/v1/models/cnn/versions/1/bundle"),
        httpx.get(f"{url}/openapi.json", timeout=30),
        httpx.get(f"{url}/ui/login", timeout=30),
    ]
    assert sorted({r.status_code for r in responses}) == [200, 400, 401, 403, 404, 405, 413, 415, 422]
    for response in responses:
        assert response.headers.get("x-content-type-options") == "nosniff", (
            response.request.method,
            response.request.url,
            response.status_code,
        )


def test_killing_the_server_during_an_upload_leaves_the_registry_unchanged(env, registered, tmp_path):
    import threading
    import time

    registry = env["registry"]
    before, audit_before = snapshot(registry), len(registry.audit())
    spool = tmp_path / "server-tmp"
    spool.mkdir()
    db, blobs = registry.db_url, registry.blob_uri
    with running_server(db=db, blobs=blobs, env={"TMPDIR": str(spool)}, log=tmp_path / "serve.log") as server:
        release = threading.Event()

        def half_a_model():
            yield pt2_bytes(small_model(seed=11), tmp_path)[:50_000]
            release.wait(30)  # the rest never comes: the server is killed first
            yield b"x"

        token = env["clients"]["writer"].headers["authorization"]
        outcome = []
        upload = threading.Thread(target=lambda: outcome.append(_post_quietly(server.url, token, half_a_model())))
        upload.start()
        deadline = time.monotonic() + 30
        while not any(spool.rglob("upload.pt2")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(spool.rglob("upload.pt2")), "the upload never reached the server's temp folder"
        server.process.kill()
        server.process.wait(30)
        release.set()
        upload.join(60)
    assert outcome and outcome[0] is None  # the connection died; no response
    assert snapshot(registry) == before and len(registry.audit()) == audit_before
    assert any(spool.glob("normbridge-upload-*"))  # SIGKILL skips every finally ...
    with running_server(db=db, blobs=blobs, env={"TMPDIR": str(spool)}, log=tmp_path / "serve2.log"):
        assert not any(spool.glob("normbridge-upload-*"))  # ... so the next server removes what the dead one left


def _post_quietly(url: str, authorization: str, body) -> httpx.Response | None:
    try:
        return httpx.post(
            f"{url}/api/v1/models/cnn/versions",
            params={"format": "pt2"},
            content=body,
            headers={"Authorization": authorization},
            timeout=60,
        )
    except httpx.HTTPError:
        return None


def test_unsafe_bundles_are_refused(env, registered):
    writer, registry = env["clients"]["writer"], env["registry"]
    before = snapshot(registry)
    for build in ("symlink", "parent", "absolute"):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(
                {"symlink": "manifest.json", "parent": "../escape.json", "absolute": "/tmp/escape.json"}[build]
            )
            if build == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = 2
                tar.addfile(info, io.BytesIO(b"{}"))
        assert_error(
            writer.post("/api/v1/models/cnn/versions", params={"format": "bundle"}, content=buffer.getvalue()),
            400,
            "bad_input_file",
        )
    assert_error(
        writer.post("/api/v1/models/cnn/versions", params={"format": "bundle"}, content=b"\x00" * 2048),
        400,
        "bad_input_file",
    )
    assert not (env["root"].parent / "escape.json").exists()
    assert snapshot(registry) == before
    assert [(e.action, e.user, e.detail["error"]) for e in registry.audit(model="cnn")[-4:]] == [
        ("register_failed", "ci-bot", "bad_input_file")
    ] * 4


def test_verify_gc_and_error_shapes(env, registered):
    admin, writer, reader, registry = (
        env["clients"]["admin"],
        env["clients"]["writer"],
        env["clients"]["reader"],
        env["registry"],
    )
    one = reader.post("/api/v1/verify", params={"ref": "cnn@1", "check": "true"})
    assert (
        one.status_code == 200
        and one.json()["passed"] is True
        and one.json()["versions"] == ["cnn@1"]
        and one.json()["checks_run"] == 1
    )
    everything = reader.post("/api/v1/verify", params={"check": "false"}).json()
    assert everything["passed"] is True and "cnn@2" in everything["versions"] and everything["checks_run"] == 0

    orphan = registry.store.put(b"left behind by a crashed upload " + os.urandom(8))
    assert_error(writer.post("/api/v1/gc", params={"grace": 0}), 403, "forbidden")
    assert_error(
        admin.post("/api/v1/gc", params={"grace": -1}), 422, "invalid_request"
    )  # a malformed request, not a refusal (409)
    # a JSON body over 32 MiB is refused before it is parsed whole (a read token's 300 MB body held about 1 GB of the
    # server)
    from registry.http.request_guard import MAX_JSON_BYTES

    big = b'{"digests": [' + b" " * (MAX_JSON_BYTES + 1) + b"]}"
    json_headers = {"Content-Type": "application/json"}
    body = assert_error(
        reader.post("/api/v1/blobs/present", content=big, headers=json_headers), 413, "payload_too_large"
    )
    assert str(MAX_JSON_BYTES) in body["message"]

    def chunked():
        yield b'{"digests": ['
        for _ in range(MAX_JSON_BYTES // (1 << 20) + 2):
            yield b" " * (1 << 20)
        yield b"]}"

    assert_error(
        reader.post("/api/v1/blobs/present", content=chunked(), headers=json_headers), 413, "payload_too_large"
    )
    assert reader.post("/api/v1/blobs/present", json={"digests": []}).status_code == 200
    swept = admin.post("/api/v1/gc", params={"grace": 0})
    assert swept.status_code == 200 and orphan in swept.json()["deleted"]
    assert not registry.store.exists(orphan)
    assert registry.audit()[-1].action == "gc" and registry.audit()[-1].user == "root-admin"

    assert_error(reader.get("/api/v1/models/cnn/versions/9"), 404, "not_found")
    assert_error(reader.get("/api/v1/models/nope/versions"), 404, "not_found")
    assert_error(reader.get("/api/v1/diff", params={"a": "cnn@1"}), 422, "invalid_request")
    assert_error(
        writer.post("/api/v1/models/cnn/versions", params={"format": "zip"}, content=b"x"), 422, "invalid_request"
    )
    assert_error(writer.put("/api/v1/models/cnn/aliases/prod", json={"version": "bn-onnx@1"}), 409, "registry_error")
    assert_error(writer.put("/api/v1/models/cnn/aliases/prod", json={"wrong": 1}), 422, "invalid_request")
    assert_error(reader.get("/api/v1/no/such/route"), 404, "not_found")
    # malformed names and references are malformed requests (422), not refusals (409) or missing models (404)
    assert_error(writer.put("/api/v1/models/cnn/aliases/latest", json={"version": 1}), 422, "invalid_request")
    assert_error(writer.put("/api/v1/models/cnn/aliases/42", json={"version": 1}), 422, "invalid_request")
    assert_error(
        writer.post("/api/v1/models/bad%20name/versions", params={"format": "onnx"}, content=b"x" * 64),
        422,
        "invalid_request",
    )
    assert_error(reader.get("/api/v1/diff", params={"a": "cnn@@1", "b": "cnn@1"}), 422, "invalid_request")
    # a version number past 64 bits names no version: SQLite's OverflowError was a 500
    huge = "99999999999999999999"
    assert_error(reader.get("/api/v1/models/cnn/versions/9223372036854775808"), 404, "not_found")
    assert_error(reader.get("/api/v1/diff", params={"a": f"cnn@{huge}", "b": "cnn@1"}), 404, "not_found")
    assert_error(writer.put("/api/v1/models/cnn/aliases/staging", json={"version": int(huge)}), 404, "not_found")
    assert_error(reader.get(f"/api/v1/models/cnn/versions/{huge}/drift"), 404, "not_found")
    assert_error(
        writer.post(
            "/api/v1/models/cnn/versions",
            params={"format": "pt2", "parent": f"cnn@{huge}"},
            content=pt2_bytes(small_model(seed=5), env["root"]),
        ),
        404,
        "not_found",
    )


def test_concurrent_uploads_each_get_their_own_version(env, registered):
    from concurrent.futures import ThreadPoolExecutor

    writer, root = env["clients"]["writer"], env["root"]
    bodies = [pt2_bytes(small_model(seed=20 + i, shift=i), root) for i in range(3)]
    with ThreadPoolExecutor(3) as pool:
        responses = list(
            pool.map(
                lambda body: writer.post("/api/v1/models/parallel/versions", params={"format": "pt2"}, content=body),
                bodies,
            )
        )
    assert [r.status_code for r in responses] == [201, 201, 201], [r.text for r in responses]
    assert sorted(r.json()["version"]["number"] for r in responses) == [1, 2, 3]
    assert all(c["passed"] for r in responses for c in r.json()["checks"])


def test_recorded_drift_checks_come_back_newest_first(env, registered):
    import numpy as np

    from converters.models.monitoring.drift import drift_check
    from registry.drift_records import record_drift

    reader = env["clients"]["reader"]
    empty = reader.get("/api/v1/models/cnn/versions/1/drift").json()
    assert (empty["reports"], empty["windows"], empty["state"]) == ([], [], "ok")
    inputs = np.random.default_rng(0).standard_normal((32, 3)).astype(np.float32)
    calm, shifted = drift_check(small_model(), inputs), drift_check(small_model(), inputs * 3 + 2)
    record_drift(env["registry"].as_user("monitor"), "cnn@1", calm)
    record_drift(env["registry"].as_user("monitor"), "cnn@1", shifted)
    reports = reader.get("/api/v1/models/cnn/versions/1/drift").json()["reports"]
    assert [(r["model"], r["number"], r["user"]) for r in reports] == [("cnn", 1, "monitor")] * 2
    assert [r["report"]["verdict"] for r in reports] == [shifted.verdict, calm.verdict] and reports[0]["id"] > reports[
        1
    ]["id"]
    assert_error(reader.get("/api/v1/models/cnn/versions/99/drift"), 404, "not_found")
    # a report relabelled 'no drift' over layers whose own numbers alarm, or naming a layer the version lacks,
    # is refused
    writer, sent = env["clients"]["writer"], shifted.model_dump(mode="json")
    assert sent["verdict"] == "drift"
    relabelled = {
        **sent,
        "verdict": "no drift",
        "alarms": [],
        "layers": [{**layer, "status": "ok"} for layer in sent["layers"]],
    }
    body = assert_error(
        writer.post("/api/v1/models/cnn/versions/1/drift/reports", json=relabelled), 422, "invalid_request"
    )
    assert "not consistent" in body["message"] and (body["layer"], body["setting"]) == (
        sent["layers"][0]["name"],
        "status",
    )
    renamed = {**sent, "layers": [{**sent["layers"][0], "name": "<b>not-a-layer</b>"}] + sent["layers"][1:]}
    body = assert_error(
        writer.post("/api/v1/models/cnn/versions/1/drift/reports", json=renamed), 422, "invalid_request"
    )
    assert "is not a BatchNorm of cnn@1" in body["message"]
    assert len(reader.get("/api/v1/models/cnn/versions/1/drift").json()["reports"]) == 2
    assert writer.post("/api/v1/models/cnn/versions/1/drift/reports", json=sent).status_code == 201


def test_openapi_lists_every_route_with_its_responses(env):
    document = httpx.get(f"{env['server'].url}/openapi.json", timeout=30).json()
    expected = {
        ("get", "/api/v1/health"): {"200", "403"},
        ("get", "/api/v1/models"): {"200", "401", "403", "422"},
        ("get", "/api/v1/models/{name}/versions"): {"200", "401", "403", "404", "422"},
        ("post", "/api/v1/models/{name}/versions"): {
            "200",
            "201",
            "400",
            "401",
            "403",
            "404",
            "409",
            "413",
            "415",
            "422",
        },
        ("get", "/api/v1/models/{name}/versions/{ref}"): {"200", "401", "403", "404", "422"},
        ("get", "/api/v1/models/{name}/versions/{ref}/lineage"): {"200", "401", "403", "404", "422"},
        ("get", "/api/v1/models/{name}/versions/{ref}/bundle"): {"200", "401", "403", "404", "422"},
        ("get", "/api/v1/models/{name}/versions/{ref}/drift"): {"200", "401", "403", "404", "422"},
        ("post", "/api/v1/models/{name}/versions/{ref}/drift"): {
            "201",
            "400",
            "401",
            "403",
            "404",
            "409",
            "415",
            "422",
        },
        ("get", "/api/v1/blobs/{digest}"): {"200", "401", "403", "404", "422"},
        ("post", "/api/v1/blobs/present"): {"200", "401", "403", "415", "422"},
        ("get", "/api/v1/diff"): {"200", "401", "403", "404", "422"},
        ("get", "/api/v1/models/{name}/aliases"): {"200", "401", "403", "404", "422"},
        ("put", "/api/v1/models/{name}/aliases/{alias}"): {"200", "401", "403", "404", "409", "415", "422"},
        ("post", "/api/v1/verify"): {"200", "401", "403", "404", "415", "422"},
        ("get", "/api/v1/audit"): {"200", "401", "403", "422"},
        ("post", "/api/v1/gc"): {"200", "401", "403", "415", "422"},
    }
    for (method, path), statuses in expected.items():
        operation = document["paths"][path][method]
        assert statuses <= set(operation["responses"]), (method, path, sorted(operation["responses"]))
        for status in statuses - {"200", "201"}:
            schema = operation["responses"][status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (method, path, status)
        if path != "/api/v1/health":
            assert operation.get("security") == [{"HTTPBearer": []}], (method, path)
    upload = document["paths"]["/api/v1/models/{name}/versions"]["post"]
    assert upload["requestBody"]["content"]["application/octet-stream"]["schema"]["format"] == "binary"
    assert upload["responses"]["201"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Registered"
    }
    bundle = document["paths"]["/api/v1/models/{name}/versions/{ref}/bundle"]["get"]
    assert "application/x-tar" in bundle["responses"]["200"]["content"]
    assert document["paths"]["/api/v1/models/{name}/versions/{ref}"]["get"]["responses"]["200"]["content"][
        "application/json"
    ]["schema"] == {"$ref": "#/components/schemas/Version"}
    assert set(document["components"]["schemas"]["ErrorDetail"]["properties"]) == {
        "code",
        "message",
        "layer",
        "setting",
        "report",
    }
    assert httpx.get(f"{env['server'].url}/docs", timeout=30).status_code == 200
