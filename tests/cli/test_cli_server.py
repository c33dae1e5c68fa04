"""The registry commands against a real `normbridge serve`: `normbridge --server URL --token T ...` over loopback HTTP.

One server (SQLite + blob folder in a temp dir) serves the whole module; tokens are minted with the
real `normbridge token create`. Most commands run in-process through Typer's CliRunner (same app,
same HTTP client, no process start-up cost); the first registration, the environment variables and
an unreachable server run as real processes.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import tarfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from registry.client import RemoteRegistry
from schemas.errors import CheckFailedError, IntegrityError, RegistryError
from tests.cli_process import normbridge_command
from tests.http_server import create_token, free_port, running_server
from tests.registry.test_registry_service import finetune_statistics, save_pt2, trained_cnn

ROOT = Path(__file__).resolve().parents[2]
REMOTE_ENV = ("NORMBRIDGE_SERVER", "NORMBRIDGE_TOKEN", "NORMBRIDGE_DB", "NORMBRIDGE_BLOBS", "NORMBRIDGE_FAULT")


@dataclass
class Served:
    url: str
    writer: str  # token of "alice", role write
    reader: str  # token of "bob", role read
    files: dict[str, Path]
    db: str
    blobs: str


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A running server with cnn@1 and cnn@2 registered by alice (the first through a real `normbridge register`
    process)."""
    root = tmp_path_factory.mktemp("served")
    model = trained_cnn()
    files = {"v1": save_pt2(model, root / "v1.pt2")}
    files["v2"] = save_pt2(finetune_statistics(model), root / "v2.pt2")
    broken = trained_cnn()
    with torch.no_grad():
        broken.bn2.weight[0] = 3e38  # the layer's output overflows float32: every framework fails the round trip
    files["broken"] = save_pt2(broken, root / "broken.pt2")
    db, blobs = f"sqlite:///{root / 'reg.db'}", str(root / "blobs")
    with running_server(db=db, blobs=blobs, log=root / "serve.log") as server:
        state = Served(
            server.url, create_token(db, "alice", "write"), create_token(db, "bob", "read"), files, db, blobs
        )
        first = process(
            "--server", state.url, "--token", state.writer, "register", "cnn", str(files["v1"]), "--note", "first"
        )
        assert first.returncode == 0, first.stderr[-3000:] + server.log_text()[-3000:]
        assert "registered cnn@1" in first.stdout and "2/2 normalization layers passed" in first.stdout
        yield state


def process(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real `normbridge` command, without any registry selection inherited from the test's environment."""
    base = {k: v for k, v in os.environ.items() if k not in REMOTE_ENV}
    return subprocess.run(
        normbridge_command() + list(args),
        cwd=ROOT,
        env={**base, "COLUMNS": "200", **(env or {})},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def cli(served: Served, *args: str, token: str | None = "writer"):
    """`normbridge --server URL --token T ARGS` in-process; token names a Served attribute, or is a literal token."""
    prefix = ["--server", served.url]
    if token is not None:
        prefix += ["--token", getattr(served, token, token)]
    return CliRunner().invoke(_app(), prefix + list(args), env={k: None for k in REMOTE_ENV} | {"COLUMNS": "200"})


def _app():
    from cli.main import app

    return app


def data(result):
    assert result.exit_code == 0, result.output + (result.stderr if hasattr(result, "stderr") else "")
    return json.loads(result.stdout)


@pytest.mark.slow
def test_register_read_diff_lineage_alias_audit_over_the_server(served):
    second = process(
        "register",
        "cnn",
        str(served.files["v2"]),
        "--json",
        env={"NORMBRIDGE_SERVER": served.url, "NORMBRIDGE_TOKEN": served.writer},
    )  # env works like --server/--token
    assert second.returncode == 0, second.stderr[-3000:]
    registered = json.loads(second.stdout)
    assert registered["created"] is True and registered["version"]["number"] == 2
    assert (registered["version"]["parent"], registered["version"]["operation"], registered["version"]["user"]) == (
        "cnn@1",
        "fine-tuned",
        "alice",
    )
    assert len(registered["checks"]) == 2 and all(c["passed"] for c in registered["checks"])

    assert data(cli(served, "models", "--json", token="reader")) == [{"name": "cnn", "latest": 2, "versions": 2}]
    listed = data(cli(served, "versions", "cnn", "--json"))
    assert [(v["number"], v["user"], v["note"]) for v in listed["versions"]] == [
        (1, "alice", "first"),
        (2, "alice", None),
    ]
    table = cli(served, "versions", "cnn")
    # The Rich table's width is fixed when cli.app's console is created (it may fold long cells):
    # check what always fits.
    assert table.exit_code == 0 and "cnn: 2 version(s)" in table.stdout and "alice" in table.stdout

    shown = cli(served, "show", "cnn@2")  # downloads the bundle: every blob re-hashed, digest checked
    assert shown.exit_code == 0, shown.output
    assert (
        "bn1" in shown.stdout
        and "bn2" in shown.stdout
        and "passed" in shown.stdout
        and registered["version"]["digest"] in shown.stdout
    )
    assert data(cli(served, "show", "cnn", "--json"))["number"] == 2  # bare NAME is the latest

    diff = data(cli(served, "diff", "cnn@1", "cnn@2", "--json"))
    assert "weights identical" in diff["headline"]
    tree = cli(served, "lineage", "cnn@2")
    assert tree.exit_code == 0 and "cnn@1" in tree.stdout and "fine-tuned" in tree.stdout
    assert data(cli(served, "lineage", "cnn@1", "--json"))["descendants"] == ["cnn@2"]

    moved = data(cli(served, "alias", "cnn", "production", "cnn@1", "--json"))
    assert (moved["number"], moved["user"]) == (1, "alice")
    assert data(cli(served, "show", "cnn@production", "--json"))["number"] == 1

    log = data(cli(served, "audit", "--model", "cnn", "--verify", "--json", token="reader"))
    assert [(e["action"], e["number"], e["user"]) for e in log["entries"]] == [
        ("register", 1, "alice"),
        ("register", 2, "alice"),
        ("alias", 1, "alice"),
    ]
    assert log["chain_ok"] is True
    from registry.service import Registry

    head = log["head"]["hash"]  # the server's head, to pin: the whole log's last entry (other models' entries included)
    assert head == Registry(db=served.db, blobs=served.blobs, user="test").audit()[-1].hash
    assert cli(served, "audit", "--verify", "--expect-head", head, token="reader").exit_code == 0
    forged = cli(served, "audit", "--verify", "--expect-head", "ab" * 32, token="reader")
    assert forged.exit_code == 12 and "the pinned audit head abababababab... is not in the audit log" in " ".join(
        forged.stdout.split()
    )
    verified = cli(served, "verify", "cnn@2", "--no-check")
    assert verified.exit_code == 0 and "verify PASSED" in verified.stdout

    missing = cli(served, "show", "cnn@9")
    assert missing.exit_code == 13 and "cnn" in missing.stderr


@pytest.mark.slow
def test_a_failing_gate_over_the_server_exits_7_naming_the_layer_and_stores_nothing(served):
    failed = cli(served, "register", "broken", str(served.files["broken"]))
    assert failed.exit_code == 7, failed.output
    assert "bn2" in failed.stderr and "check_failed" in failed.stderr
    as_json = cli(served, "register", "broken", str(served.files["broken"]), "--json")
    assert as_json.exit_code == 7 and json.loads(as_json.stdout)["error"]["code"] == "check_failed"
    with pytest.raises(CheckFailedError) as error:  # the library client keeps the server's CheckResult
        RemoteRegistry(served.url, served.writer).register("broken", served.files["broken"])
    assert error.value.result is not None and error.value.result.passed is False
    assert cli(served, "versions", "broken").exit_code == 13


@pytest.mark.slow
def test_tokens_roles_and_an_unreachable_server_have_their_own_exit_codes(served):
    forbidden = cli(served, "register", "cnn", str(served.files["v1"]), token="reader")
    assert forbidden.exit_code == 16 and "forbidden" in forbidden.stderr
    alias_by_reader = cli(served, "alias", "cnn", "staging", "cnn@1", token="reader")
    assert alias_by_reader.exit_code == 16
    bad = cli(served, "models", token="nbt_0123456789ab_" + "x" * 43)
    assert bad.exit_code == 15 and "unauthorized" in bad.stderr
    assert cli(served, "models", token=None).exit_code == 15  # no anonymous access without --insecure-local

    nowhere = f"http://127.0.0.1:{free_port()}"
    unreachable = process("--server", nowhere, "models")
    assert unreachable.returncode == 18 and nowhere in unreachable.stderr and "NORMBRIDGE_SERVER" in unreachable.stderr
    assert cli(served, "gc", "--grace", "0").exit_code == 16  # gc needs an admin token
    mixed = cli(served, "models", "--db", "sqlite:///elsewhere.db")
    assert mixed.exit_code == 2 and "--server" in mixed.output


@pytest.mark.slow
def test_export_over_the_server_writes_the_same_files_as_a_local_export(served, tmp_path):
    from registry.service import Registry

    local = Registry(db=f"sqlite:///{tmp_path / 'local.db'}", blobs=str(tmp_path / "blobs"), user="local")
    local.register("cnn", served.files["v1"], note="first")
    expected = local.export("cnn@1", "onnx", tmp_path / "local")

    done = data(
        cli(served, "export-layers", "cnn@1", "--to", "onnx", "-o", str(tmp_path / "remote"), "--json", token="reader")
    )
    assert done["version"] == "cnn@1" and len(done["layers"]) == 2
    local_files = {Path(layer.file).name: Path(layer.file).read_bytes() for layer in expected.layers}
    remote_files = {Path(layer["file"]).name: Path(layer["file"]).read_bytes() for layer in done["layers"]}
    assert sorted(remote_files) == sorted(local_files) == ["bn1.onnx", "bn2.onnx"]
    assert remote_files == local_files
    assert [layer["report"] for layer in done["layers"]] == [layer.report for layer in expected.layers]


@pytest.mark.slow
def test_library_client_streams_with_byte_progress_registers_folders_and_refuses_in_memory_models(served, tmp_path):
    from registry.artifact import extract_artifact
    from registry.manifest_io import save_artifact_folder

    seen: dict[str, list[tuple[int, int | None]]] = {}

    @contextmanager
    def transfer(description, total):
        yield lambda done: seen.setdefault(description, []).append((done, total))

    remote = RemoteRegistry(served.url, served.writer, transfer=transfer)
    again = remote.register("cnn", served.files["v1"])  # identical content: the existing version comes back
    assert (again.created, again.version.number) == (False, 1)
    size = served.files["v1"].stat().st_size
    assert seen["uploading v1.pt2"][-1] == (size, size) and len(seen["uploading v1.pt2"]) >= 1

    folder = save_artifact_folder(extract_artifact(served.files["v1"]), tmp_path / "artifact")
    imported = remote.register("cnn-copy", folder)  # an artifact folder goes up as a tar built while it is sent
    assert imported.created and imported.version.operation == "imported"
    assert imported.version.content_digest == remote.show("cnn@1").content_digest

    tensors = remote.tensors("cnn@1")
    assert seen["downloading cnn@1"][-1][0] == seen["downloading cnn@1"][-1][1]
    assert set(tensors) == set(remote.manifest("cnn@1").tensors) and "bn2.running_var" in tensors
    with pytest.raises(RegistryError, match="save it to a file first"):
        remote.register("cnn", trained_cnn())


@pytest.mark.slow
def test_an_upload_leaves_out_the_blobs_the_server_already_holds_for_the_token(served, tmp_path):
    """A fine-tune that moved only the BatchNorm statistics sends only those: the weights are cnn@1's (and any other
    blob a version this token may read holds is left out too)."""
    from registry.artifact import extract_artifact
    from registry.manifest_io import load_artifact_folder, save_artifact_folder
    from registry.client_transfer import folder_tar_size

    totals: dict[str, int | None] = {}

    @contextmanager
    def transfer(description, total):
        totals[description] = total
        yield lambda done: None

    folder = save_artifact_folder(extract_artifact(finetune_statistics(trained_cnn(), seed=7)), tmp_path / "stats-only")
    remote = RemoteRegistry(served.url, served.writer, transfer=transfer)
    held = {
        t["digest"]
        for name, _, _ in remote.models()
        for v in remote.versions(name)
        for t in v.manifest["tensors"].values()
    }
    artifact = load_artifact_folder(folder)
    unchanged = frozenset(set(artifact.blobs) & held)
    assert unchanged and set(artifact.blobs) - held  # the weights are shared, the statistics are new
    result = remote.register("cnn-stats", folder)
    assert result.created and all(c.passed for c in result.checks)
    assert totals[f"uploading {folder.name}"] == folder_tar_size(folder, unchanged) < folder_tar_size(folder)
    stored = remote.tensors("cnn-stats@1")  # downloaded and re-hashed: what was left out is there, byte for byte
    assert {n: a.tobytes() for n, a in stored.items()} == {
        n: artifact.blobs[ref.digest][len(artifact.blobs[ref.digest]) - ref.nbytes :]
        for n, ref in artifact.manifest.tensors.items()
    }


@pytest.mark.slow
def test_a_scoped_token_cannot_leave_out_blobs_of_a_model_it_may_not_read(served, tmp_path):
    import httpx

    from registry.artifact import extract_artifact
    from registry.manifest_io import save_artifact_folder

    carol = create_token(served.db, "carol", "write", models=["carols"])
    digests = sorted(
        {ref.digest for ref in RemoteRegistry(served.url, served.writer).manifest("cnn@1").tensors.values()}
    )
    with httpx.Client(base_url=served.url, timeout=60) as client:

        def present(token: str) -> httpx.Response:
            return client.post(
                "/api/v1/blobs/present", json={"digests": digests}, headers={"Authorization": f"Bearer {token}"}
            )

        assert present(served.writer).json() == {"present": digests}
        assert present(carol).json() == {"present": []}  # cnn's blobs are invisible to carol, whether or not they exist
        assert (
            client.post(
                "/api/v1/blobs/present", json={"digests": ["x"] * 100_001}, headers={"Authorization": f"Bearer {carol}"}
            ).status_code
            == 422
        )
        folder = save_artifact_folder(extract_artifact(served.files["v1"]), tmp_path / "copy")
        manifest_only = io.BytesIO()
        with tarfile.open(fileobj=manifest_only, mode="w") as tar:
            tar.add(folder / "manifest.json", arcname="manifest.json")
        refused = client.post(
            "/api/v1/models/carols/versions",
            params={"format": "bundle"},
            content=manifest_only.getvalue(),
            headers={"Authorization": f"Bearer {carol}", "Content-Type": "application/octet-stream"},
        )
        assert refused.status_code == 400, refused.text
        assert "missing from the bundle (it may be left out only when" in refused.json()["error"]["message"]
    sent = RemoteRegistry(served.url, carol).register("carols", folder)  # the client sends carol everything
    assert (
        sent.created
        and sent.version.content_digest == RemoteRegistry(served.url, served.writer).show("cnn@1").content_digest
    )


@pytest.mark.slow
def test_a_tampered_blob_on_the_server_is_never_used_by_the_client(served):
    """Last server test: it damages cnn@2 (its fine-tuned statistics are its own blobs)."""
    from registry.service import Registry
    from tests.registry.test_registry_service import blob_path

    registry = Registry(db=served.db, blobs=served.blobs, user="test")
    path = blob_path(registry, registry.show("cnn@2").manifest["tensors"]["bn2.running_mean"]["digest"])
    path.chmod(stat.S_IWUSR | stat.S_IRUSR)
    damaged = bytearray(path.read_bytes())
    damaged[-2] ^= 0x10
    path.write_bytes(bytes(damaged))

    shown = cli(served, "show", "cnn@2")
    assert shown.exit_code == 12, shown.output
    verified = cli(served, "verify", "cnn@2", "--no-check", "--json", token="reader")
    assert verified.exit_code == 12
    assert [(p["number"], p["tensor"]) for p in json.loads(verified.stdout)["problems"]] == [(2, "bn2.running_mean")]
    exported = cli(served, "export-layers", "cnn@2", "--to", "onnx", "-o", str(Path(served.blobs).parent / "never"))
    assert exported.exit_code == 12 and not (Path(served.blobs).parent / "never").exists()


def test_a_bundle_with_links_or_escaping_paths_is_never_extracted(tmp_path):
    from registry.client_transfer import extract_bundle

    for label, member in (("escape", tarfile.TarInfo("../evil")), ("link", tarfile.TarInfo("manifest.json"))):
        if label == "link":
            member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive = tmp_path / f"{label}.tar"
        with tarfile.open(archive, "w") as tar:
            member.size = 0 if label == "link" else 4
            tar.addfile(member, None if label == "link" else io.BytesIO(b"evil"))
        with pytest.raises(IntegrityError, match="unexpected member"):
            extract_bundle(archive, tmp_path / label / "bundle")
    assert not (tmp_path / "escape" / "evil").exists() and not (tmp_path / "link" / "bundle" / "manifest.json").exists()


@pytest.mark.slow
def test_a_malformed_reference_is_refused_the_same_way_locally_and_over_the_server(served):
    for ref in ("cnn@", "@2"):
        remote = cli(served, "show", ref)
        local = CliRunner().invoke(
            _app(),
            ["show", ref, "--db", served.db, "--blobs", served.blobs],
            env={k: None for k in REMOTE_ENV} | {"COLUMNS": "200"},
        )
        assert remote.exit_code == local.exit_code == 2, (
            remote.output,
            local.output,
        )  # a usage error, before any registry is asked
        assert (
            f"'{ref}' is not a version reference" in remote.stderr
            and f"'{ref}' is not a version reference" in local.stderr
        )
