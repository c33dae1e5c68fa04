"""The metadata store on SQLite and on PostgreSQL: numbering, dedup, refs, aliases, lineage, audit chain."""

from __future__ import annotations

from pathlib import Path

import hashlib
import itertools
import time

import pytest
from sqlalchemy import inspect, text

from registry.db.engine import make_engine
from registry.metadata import MetadataStore
from schemas.errors import NotFoundError, RegistryError
from tests.pg import fresh_database


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        metadata = MetadataStore(f"sqlite:///{tmp_path / 'registry.db'}")
        yield metadata
        metadata.close()
    else:
        with fresh_database() as url:
            metadata = MetadataStore(url)
            yield metadata
            metadata.close()


def h(text_: str) -> str:
    return hashlib.sha256(text_.encode()).hexdigest()


def add(store, model, content, parent=None, operation="registered", user="alice", blobs=()):
    return store.add_version(
        model,
        h("artifact " + content),
        h(content),
        {"content": content},
        [h(b) for b in blobs],
        parent,
        operation,
        None,
        user,
    )


def test_the_schema_comes_from_alembic(store):
    tables = set(inspect(store.engine).get_table_names())
    assert {
        "alembic_version",
        "models",
        "versions",
        "version_blobs",
        "aliases",
        "alias_history",
        "audit_log",
        "api_tokens",
        "drift_reports",
        "blob_leases",
        "audit_head",
    } <= tables
    with store.engine.connect() as connection:
        newest = max(
            path.name[:4]
            for path in (Path(__file__).resolve().parents[2] / "registry/migrations/versions").glob("[0-9]*.py")
        )
        assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == newest
    MetadataStore(store.url).close()  # opening again is an idempotent upgrade


def test_the_head_read_from_the_migration_files_is_alembics_own(store, tmp_path):
    from alembic.script import ScriptDirectory

    from registry.db.engine import alembic_config, at_head, head_revision

    assert head_revision() == ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert at_head(store.engine)  # a store at the head opens without Alembic
    empty = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    assert not at_head(empty)  # no alembic_version table: Alembic creates the schema
    empty.dispose()


def test_versions_are_numbered_per_model_and_never_reused(store):
    assert [add(store, "cnn", f"c{i}")[0].number for i in range(3)] == [1, 2, 3]
    assert add(store, "other", "c0")[0].number == 1  # same content, other model: a new version
    store.delete_version("cnn", 3, "alice")
    assert add(store, "cnn", "c3")[0].number == 4
    assert [v.number for v in store.versions("cnn")] == [1, 2, 4]
    assert store.models() == [("cnn", 4, 3), ("other", 1, 1)]


def test_identical_content_returns_the_existing_version(store):
    first, created = add(store, "cnn", "same", blobs=["w"])
    again, created_again = add(store, "cnn", "same", user="bob")
    assert created and not created_again
    assert again == first
    assert len(store.versions("cnn")) == 1
    assert [(e.action, e.number, e.user) for e in store.audit("cnn")] == [
        ("register", 1, "alice"),
        ("register_existing", 1, "bob"),
    ]


def test_resolve_by_number_alias_and_latest(store):
    for i in range(3):
        add(store, "cnn", f"c{i}")
    assert store.resolve("cnn@2").number == 2
    assert store.resolve("cnn").number == 3
    store.set_alias("cnn", "production", 1, "alice")
    assert store.resolve("cnn@production").number == 1
    with pytest.raises(NotFoundError, match="cnn@9 does not exist; cnn has versions 1-3"):
        store.resolve("cnn@9")
    with pytest.raises(NotFoundError, match="no alias 'staging'; its aliases are production"):
        store.resolve("cnn@staging")
    with pytest.raises(NotFoundError, match="model 'rnn' is not in the registry"):
        store.resolve("rnn")


def test_alias_moves_are_recorded(store):
    for i in range(3):
        add(store, "cnn", f"c{i}")
    store.set_alias("cnn", "production", 1, "alice")
    store.set_alias("cnn", "production", 3, "bob")
    store.set_alias("cnn", "staging", 2, "bob")
    assert [(a.alias, a.number, a.user) for a in store.aliases("cnn")] == [
        ("production", 3, "bob"),
        ("staging", 2, "bob"),
    ]
    history = store.alias_history("cnn", "production")
    assert [(a.number, a.user) for a in history] == [(1, "alice"), (3, "bob")]
    assert history[0].moved_at <= history[1].moved_at
    alias_entries = [e for e in store.audit("cnn") if e.action == "alias"]
    assert [e.detail for e in alias_entries] == [
        {"alias": "production", "from": None, "to": 1},
        {"alias": "production", "from": 1, "to": 3},
        {"alias": "staging", "from": None, "to": 2},
    ]
    with pytest.raises(RegistryError, match="not a number"):
        store.set_alias("cnn", "7", 1, "alice")
    with pytest.raises(RegistryError, match="alias.*production"):
        store.delete_version("cnn", 3, "alice")


def test_lineage_on_a_chain_and_a_branch(store):
    #  cnn@1 -> cnn@2 -> cnn@3
    #              \-> cnn@4 -> onnx-cnn@1
    add(store, "cnn", "a")
    add(store, "cnn", "b", parent=("cnn", 1), operation="fine-tuned")
    add(store, "cnn", "c", parent=("cnn", 2), operation="recalibrated")
    add(store, "cnn", "d", parent=("cnn", 2), operation="fine-tuned")
    exported, _ = add(store, "onnx-cnn", "e", parent=("cnn", 4), operation="converted")
    assert exported.parent == "cnn@4"
    ancestors, descendants = store.lineage_edges("cnn", 3)
    assert [a.ref for a in ancestors] == ["cnn@2", "cnn@1"] and descendants == []
    ancestors, descendants = store.lineage_edges("cnn", 2)
    assert [a.ref for a in ancestors] == ["cnn@1"]
    assert sorted(d.ref for d in descendants[:2]) == ["cnn@3", "cnn@4"] and descendants[2].ref == "onnx-cnn@1"
    assert [(d.ref, d.parent, d.operation) for d in descendants][2] == ("onnx-cnn@1", "cnn@4", "converted")
    ancestors, _ = store.lineage_edges("onnx-cnn", 1)
    assert [a.ref for a in ancestors] == ["cnn@4", "cnn@2", "cnn@1"]
    with pytest.raises(NotFoundError):
        add(store, "cnn", "f", parent=("cnn", 99))


def test_lineage_of_a_long_chain(store):
    add(store, "chain", "v1")
    for i in range(2, 201):
        add(store, "chain", f"v{i}", parent=("chain", i - 1), operation="fine-tuned")
    ancestors, descendants = store.lineage_edges("chain", 100)
    assert [a.number for a in ancestors] == list(range(99, 0, -1))
    assert [d.number for d in descendants] == list(range(101, 201))


def test_delete_refuses_a_version_with_children(store):
    add(store, "cnn", "a", blobs=["w1", "s1"])
    add(store, "cnn", "b", parent=("cnn", 1), blobs=["w1", "s2"])
    with pytest.raises(RegistryError, match=r"cnn@1 has children \(cnn@2\)"):
        store.delete_version("cnn", 1, "alice")
    assert store.referenced_digests() == {h("w1"), h("s1"), h("s2"), h("artifact a"), h("artifact b")}
    store.delete_version("cnn", 2, "alice")
    assert store.referenced_digests() == {h("w1"), h("s1"), h("artifact a")}
    store.delete_version("cnn", 1, "alice")
    assert store.referenced_digests() == set() and store.models() == []
    assert [e.action for e in store.audit("cnn")][-2:] == ["delete", "delete"]


def test_the_audit_chain_verifies_and_detects_a_tampered_entry(store):
    add(store, "cnn", "a", user="alice")
    add(store, "cnn", "b", parent=("cnn", 1), user="bob")
    store.set_alias("cnn", "production", 2, "bob")
    store.record_failure("cnn", "carol", {"layer": "bn1", "reason": "NaN running_var"})
    entries = store.audit()
    assert [e.action for e in entries] == ["register", "register", "alias", "register_failed"]
    assert [e.seq for e in entries] == [1, 2, 3, 4]
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(entries))
    assert [e.action for e in store.audit(user="bob")] == ["register", "alias"]
    assert store.verify_audit() == []

    with store.engine.connect() as connection:  # the database itself refuses edits ...
        with pytest.raises(Exception, match="append-only"):
            connection.execute(text("UPDATE audit_log SET \"user\" = 'mallory' WHERE seq = 2"))
        connection.rollback()
    with store.engine.begin() as connection:  # ... until someone with DDL rights drops the guard
        if store.engine.dialect.name == "sqlite":
            connection.execute(text("DROP TRIGGER audit_log_no_update"))
        else:
            connection.execute(text("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only"))
        connection.execute(text("UPDATE audit_log SET \"user\" = 'mallory' WHERE seq = 2"))
    problems = store.verify_audit()
    assert len(problems) == 1 and problems[0].startswith("audit entry 2 (register cnn@2)")
    assert "was modified" in problems[0]


def test_timestamps_are_utc_and_ordered(store):
    before = time.time()
    first, _ = add(store, "cnn", "a")
    second, _ = add(store, "cnn", "b")
    assert first.created_at.utcoffset().total_seconds() == 0
    assert before - 5 <= first.created_at.timestamp() <= second.created_at.timestamp() <= time.time() + 5


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_an_unreachable_postgresql_fails_on_ci_and_skips_elsewhere(monkeypatch, ci, outcome):
    monkeypatch.setenv("NORMBRIDGE_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/test")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="unreachable"), fresh_database():
        pass


def test_unknown_references_and_names_are_refused(store):
    with pytest.raises(RegistryError, match="malformed"):
        store.resolve("cnn@")
    with pytest.raises(RegistryError, match="without '@'"):
        add(store, "a@b", "x")
    with pytest.raises(NotFoundError, match=r"registered models: none yet"):
        store.versions("cnn")


def test_lineage_without_manifests_keeps_the_graph(store):
    add(store, "cnn", "a")
    add(store, "cnn", "b", parent=("cnn", 1), operation="recalibrated")
    ancestors, descendants = store.lineage_edges("cnn", 1, manifests=False)
    assert ancestors == [] and [(d.ref, d.parent, d.operation, d.manifest) for d in descendants] == [
        ("cnn@2", "cnn@1", "recalibrated", {})
    ]
    assert store.lineage_edges("cnn", 2)[0][0].manifest == {"content": "a"}


def test_readers_do_not_wait_for_a_writer_holding_the_lock(store):
    """Reads BEGIN without the write lock (SQLite) / under MVCC (PostgreSQL):
    a long registration never stalls the API's reads."""
    add(store, "cnn", "c0")
    writer = store._sessions()
    writer.begin()
    writer.execute(text("UPDATE models SET last_number = last_number WHERE name = 'cnn'"))  # holds the write lock
    try:
        started = time.monotonic()
        assert [v.number for v in store.versions("cnn")] == [1]
        assert store.resolve("cnn@1").number == 1 and store.models() == [("cnn", 1, 1)]
        assert time.monotonic() - started < 5.0  # a queued reader would wait for the busy timeout (60 s)
    finally:
        writer.rollback()
        writer.close()
