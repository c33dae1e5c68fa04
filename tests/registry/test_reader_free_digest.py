"""The same bytes are the same content whatever framework release read them (issue 31, item 5).

A version's content digest once covered each normalizer's `source.framework_version`: the same `.pt2` registered again
under torch 2.14 became "fine-tuned from @1". The version that read a file stays in the manifest (provenance) and leaves
the content digest; migration 0008 recomputes the digests a registry made by an older release stored.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from alembic import command
from sqlalchemy import select, update

from registry.db.engine import alembic_config
from registry.db.models import VersionRow
from tests.pg import registry_on
from testkit.monitoring_models import torch_cnn

CONTENT = ("framework", "format", "mode", "tensors", "normalizers", "structure")


def old_release_digest(manifest: dict) -> str:
    """The content digest as releases before migration 0008 computed it: every content field, provenance included."""
    content = {name: manifest[name] for name in CONTENT if name in manifest}
    return hashlib.sha256(
        json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    ).hexdigest()


def with_reader(manifest: dict, version: str) -> dict:
    """The manifest as a process with `version` of the framework would have written it."""
    normalizers = [
        {**entry, "spec": {**entry["spec"], "source": {**entry["spec"]["source"], "framework_version": version}}}
        for entry in manifest["normalizers"]
    ]
    return {**manifest, "normalizers": normalizers}


@pytest.fixture(params=["sqlite", "postgresql"])
def registry(request, tmp_path):
    with registry_on(request.param, tmp_path, "digests") as reg:
        yield reg


def test_the_same_model_read_under_another_torch_release_is_unchanged(registry, monkeypatch):
    model = torch_cnn()
    first = registry.register("cnn", model)
    sources = [entry["spec"]["source"] for entry in first.version.manifest["normalizers"]]
    assert sources and {source["framework_version"] for source in sources} == {torch.__version__.split("+")[0]}
    monkeypatch.setattr(
        torch, "__version__", "2.14.1+cu130"
    )  # the reading process's release, as the adapters record it
    again = registry.register("cnn", model)
    assert (
        not again.created and again.version.number == 1 and again.version.content_digest == first.version.content_digest
    )
    assert [v.number for v in registry.versions("cnn")] == [1]


def test_a_registry_made_by_an_older_release_keeps_recognising_its_bytes(registry):
    """A version stored by an older release (old digest formula, read under torch 2.12) is found again after the
    upgrade."""
    model = torch_cnn()
    registry.register("cnn", model)
    with registry.meta.engine.connect() as connection:  # the row as the older release stored it, at its schema
        row = connection.execute(select(VersionRow.id, VersionRow.manifest)).one()
        manifest = json.loads(row.manifest) if isinstance(row.manifest, str) else row.manifest
        old = with_reader(manifest, "2.12.0")
        connection.execute(
            update(VersionRow)
            .where(VersionRow.id == row.id)
            .values(manifest=old, content_digest=old_release_digest(old))
        )
        connection.commit()
        command.downgrade(alembic_config(connection), "0007")
        connection.commit()
        assert connection.execute(select(VersionRow.content_digest)).scalar_one() == old_release_digest(old)
        command.upgrade(alembic_config(connection), "head")
        connection.commit()
    again = registry.register("cnn", model)
    assert not again.created and again.version.number == 1
    assert (
        again.version.manifest["normalizers"][0]["spec"]["source"]["framework_version"] == "2.12.0"
    )  # provenance kept


def test_the_downgrade_gives_back_the_old_formula(registry):
    model = torch_cnn()
    first = registry.register("cnn", model)
    with registry.meta.engine.connect() as connection:
        command.downgrade(alembic_config(connection), "0007")
        connection.commit()
        stored = connection.execute(select(VersionRow.content_digest)).scalar_one()
        command.upgrade(alembic_config(connection), "head")
        connection.commit()
    assert stored == old_release_digest(first.version.manifest) != first.version.content_digest
    assert registry.show("cnn@1").content_digest == first.version.content_digest
