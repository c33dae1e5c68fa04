"""gc is audited by the registry itself: a local `Registry.gc`, a local `normbridge gc` and POST /gc each write one
entry."""

from __future__ import annotations

import json
import os

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from registry.http.app import create_app
from registry.service import Registry

REMOTE_ENV = ("NORMBRIDGE_SERVER", "NORMBRIDGE_TOKEN", "NORMBRIDGE_DB", "NORMBRIDGE_BLOBS", "NORMBRIDGE_FAULT")


def _registry(tmp_path, user: str) -> Registry:
    return Registry(db=f"sqlite:///{tmp_path / 'registry.db'}", blobs=str(tmp_path / "blobs"), user=user)


def test_a_local_gc_writes_one_audit_entry_with_what_it_deleted(tmp_path):
    registry = _registry(tmp_path, "janitor")
    data = b"left behind by a crashed upload " + os.urandom(8)
    orphan = registry.store.put(data)
    result = registry.gc(grace_seconds=0)
    assert result.deleted == [orphan]
    entries = registry.audit()
    assert [(e.action, e.user, e.model, e.number) for e in entries] == [("gc", "janitor", None, None)]
    assert entries[0].detail == {"deleted": 1, "bytes_freed": len(data), "grace_seconds": 0.0}
    assert registry.verify_audit() == []
    registry.meta.close()


def test_the_local_normbridge_gc_command_is_audited(tmp_path):
    from cli.main import app

    db, blobs = f"sqlite:///{tmp_path / 'registry.db'}", str(tmp_path / "blobs")
    _registry(tmp_path, "setup").store.put(b"unreferenced " + os.urandom(8))
    result = CliRunner().invoke(
        app,
        ["gc", "--grace", "0", "--db", db, "--blobs", blobs, "--json"],
        env={k: None for k in REMOTE_ENV} | {"NORMBRIDGE_USER": "operator", "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["deleted"]) == 1
    registry = _registry(tmp_path, "reader")
    assert [(e.action, e.user, e.detail["deleted"]) for e in registry.audit()] == [("gc", "operator", 1)]
    registry.meta.close()


def test_post_gc_writes_exactly_one_audit_entry(tmp_path):
    registry = _registry(tmp_path, "server")
    registry.store.put(b"unreferenced " + os.urandom(8))
    with TestClient(create_app(registry, insecure_local=True), base_url="http://127.0.0.1") as client:
        response = client.post("/api/v1/gc", params={"grace": 0})
        assert response.status_code == 200, response.text
        assert len(response.json()["deleted"]) == 1
    assert [(e.action, e.user, e.detail["deleted"]) for e in registry.audit()] == [("gc", "local", 1)]
    registry.meta.close()
