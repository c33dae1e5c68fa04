"""One scenario through the local `Registry` and through `RemoteRegistry` against a real `normbridge serve`:
same answers.

Both implement `registry.service.interface.ModelRegistry`; the CLI takes either (`--server`). The scenario registers two
versions of a CNN (.pt2 files), lists and shows them, diffs them, moves an alias and pulls a version back, and every
answer is held equal between the two, but what differs by nature (the time of a row; a local registration's timings).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from registry.client import RemoteRegistry
from registry.service import ModelRegistry, Registry
from tests.http_server import create_token, running_server
from tests.registry.test_registry_service import finetune_statistics, save_pt2, trained_cnn

pytestmark = pytest.mark.slow  # starts a server


def version_facts(record) -> dict:
    """A VersionRecord but for the time it was written."""
    return {
        name: getattr(record, name)
        for name in (
            "model",
            "number",
            "digest",
            "content_digest",
            "manifest",
            "parent",
            "operation",
            "note",
            "user",
            "servable",
            "hazards",
            "structure_checked",
        )
    }


def run_scenario(registry: ModelRegistry, files: dict[str, Path], out: Path) -> dict:
    """Every call of the scenario, each answer reduced to what both sides must agree on."""
    first = registry.register("cnn", files["v1"], note="first")
    second = registry.register("cnn", files["v2"])
    again = registry.register("cnn", files["v2"])  # identical content: the existing version, not a new one
    alias = registry.set_alias("cnn", "production", "cnn@1")
    pulled = registry.pull("cnn@2", out / "cnn2.pt2")
    return {
        "registrations": [(r.created, r.version.ref, [c.passed for c in r.checks]) for r in (first, second, again)],
        "models": registry.models(),
        "versions": [version_facts(v) for v in registry.versions("cnn")],
        "show": version_facts(registry.show("cnn@production")),
        "latest": registry.show("cnn").ref,
        "manifest": registry.manifest("cnn@2").model_dump(mode="json"),
        "diff": registry.diff("cnn@1", "cnn@2").model_dump(mode="json"),
        "aliases": [(a.model, a.alias, a.number, a.user) for a in registry.aliases("cnn")],
        "alias": (alias.model, alias.alias, alias.number, alias.user),
        "pulled": (
            pulled.ref,
            pulled.format,
            pulled.digest,
            pulled.nbytes,
            Path(pulled.path).name,
            hashlib.sha256(Path(pulled.path).read_bytes()).hexdigest(),
        ),
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    model = trained_cnn()
    v1 = save_pt2(model, root / "v1.pt2")
    return {"v1": v1, "v2": save_pt2(finetune_statistics(model), root / "v2.pt2")}


def test_both_registries_implement_the_one_interface():
    assert issubclass(Registry, ModelRegistry) and issubclass(RemoteRegistry, ModelRegistry)
    assert not Registry.__abstractmethods__ and not RemoteRegistry.__abstractmethods__


def test_the_same_scenario_gives_the_same_answers_locally_and_over_http(files, tmp_path):
    (tmp_path / "local").mkdir()
    (tmp_path / "remote").mkdir()
    local = Registry(db=f"sqlite:///{tmp_path / 'local.db'}", blobs=str(tmp_path / "local-blobs"), user="alice")
    here = run_scenario(local, files, tmp_path / "local")

    db, blobs = f"sqlite:///{tmp_path / 'remote.db'}", str(tmp_path / "remote-blobs")
    token = create_token(db, "alice", "write")
    with running_server(db=db, blobs=blobs, log=tmp_path / "serve.log") as server:
        with RemoteRegistry(server.url, token) as remote:
            there = run_scenario(remote, files, tmp_path / "remote")

    assert here["registrations"][:2] == [(True, "cnn@1", [True, True]), (True, "cnn@2", [True, True])]
    assert here["registrations"][2][:2] == (False, "cnn@2")
    assert here["alias"] == ("cnn", "production", 1, "alice") and here["latest"] == "cnn@2"
    assert here["pulled"][:2] == ("cnn@2", "pt2") and "weights identical" in here["diff"]["headline"]
    for key in here:
        assert here[key] == there[key], key
