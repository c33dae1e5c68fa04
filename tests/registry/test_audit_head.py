"""Cutting the end of the audit log is detected (issue 11, item 8), on SQLite and PostgreSQL,
in the library and the CLI.

Deleting the LAST entries of a hash chain breaks no hash, so with the append-only triggers dropped (someone with DDL
rights) the cut chain used to verify. The head row (audit_head), moved in the same transaction as every append, no
longer matches; an attacker who rewrites the head row too is caught by a head pinned earlier (`normbridge audit
--verify` prints it, `--expect-head` takes it back). A registry created before the head existed gets it at upgrade.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import text

from registry.audit_chain import GENESIS, entry_hash, entry_payload
from registry.db.engine import alembic_config, make_engine
from registry.metadata import MetadataStore
from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli
from tests.pg import fresh_database

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry.db'}"
        return
    with fresh_database() as database:
        yield database


def h(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def fill(store: MetadataStore) -> None:
    """Four entries: two registrations, an alias move, a refused registration."""
    for content, parent in (("a", None), ("b", ("cnn", 1))):
        store.add_version(
            "cnn",
            h("artifact " + content),
            h(content),
            {"content": content},
            [h("blob " + content)],
            parent,
            "registered",
            None,
            "alice",
        )
    store.set_alias("cnn", "production", 2, "bob")
    store.record_failure("cnn", "carol", {"layer": "bn1", "reason": "NaN running_var"})


def as_attacker(store: MetadataStore, *statements: str) -> None:
    """Drop every guard the database has on the audit tables (an attacker with DDL rights), then run `statements`."""
    with store.engine.begin() as connection:
        if store.engine.dialect.name == "sqlite":
            for trigger in ("audit_log_no_update", "audit_log_no_delete", "audit_head_no_delete", "audit_head_forward"):
                connection.execute(text(f"DROP TRIGGER IF EXISTS {trigger}"))
        else:
            connection.execute(text("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only"))
            connection.execute(text("ALTER TABLE audit_head DISABLE TRIGGER audit_head_forward"))
        for statement in statements:
            connection.execute(text(statement))


def test_the_head_follows_every_append_and_the_database_refuses_to_move_it_otherwise(url):
    store = MetadataStore(url)
    fill(store)
    entries = store.audit()
    check = store.check_audit()
    assert check.problems == [] and (check.head.seq, check.head.hash) == (4, entries[-1].hash) and check.entries == 4
    for statement in (
        "UPDATE audit_head SET seq = 2, hash = (SELECT hash FROM audit_log WHERE seq = 2)",
        "DELETE FROM audit_head",
        "UPDATE audit_head SET seq = 5, hash = 'forged'",
    ):
        with store.engine.connect() as connection, pytest.raises(Exception, match="audit_head only moves"):
            connection.execute(text(statement))
    assert store.check_audit().head == check.head
    store.close()


def test_entries_deleted_from_the_end_are_detected_and_later_appends_keep_the_cut_visible(url):
    store = MetadataStore(url)
    fill(store)
    as_attacker(store, "DELETE FROM audit_log WHERE seq > 2")
    assert [e.seq for e in store.audit()] == [1, 2]
    problems = store.verify_audit()
    assert problems == [problems[0]] and problems[0].startswith(
        "the audit log ends at entry 2 but its head says 4: entries 3-4 were deleted"
    )
    # the next entry continues from the head, not from the surviving last row: the gap stays in the chain for good
    store.record_failure("cnn", "dave", {"reason": "after the cut"})
    assert [e.seq for e in store.audit()] == [1, 2, 5]
    problems = store.verify_audit()
    assert any("expected sequence number 3; entries are missing" in p for p in problems)
    assert any(p.startswith("audit entry 5: prev_hash") for p in problems)
    store.close()


def test_a_rewritten_head_is_caught_by_the_head_pinned_earlier(url):
    store = MetadataStore(url)
    fill(store)
    pinned = store.check_audit().head.hash
    store.set_alias("cnn", "staging", 1, "bob")  # the log grows after the pin: still fine
    assert store.verify_audit(pinned) == []
    as_attacker(
        store,
        "DELETE FROM audit_log WHERE seq > 2",
        "UPDATE audit_head SET seq = 2, hash = (SELECT hash FROM audit_log WHERE seq = 2)",
    )
    assert store.verify_audit() == []  # head and log agree: without a pin this cannot be told from a two-entry log
    problems = store.verify_audit(pinned)
    assert len(problems) == 1 and problems[0].startswith(
        f"the pinned audit head {pinned[:12]}... is not in the audit log"
    )
    store.close()


def cli(url: str, *args: str, process: bool = False) -> subprocess.CompletedProcess:
    """`normbridge ARGS` on the registry at `url`: in this process (tests.cli_run.invoke_cli),
    or as a real process if `process`."""
    if not process:
        return invoke_cli(*args, cwd=ROOT, columns=250, env={"NORMBRIDGE_DB": url})
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "NORMBRIDGE_DB": url, "COLUMNS": "250"}
    return subprocess.run(
        normbridge_command() + list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
    )


@pytest.mark.slow
def test_the_cli_prints_the_head_to_pin_and_exits_12_on_a_cut_log(url, tmp_path):
    store = MetadataStore(url)
    fill(store)
    blobs = ["--blobs", str(tmp_path / "blobs")]
    intact = cli(url, "audit", "--verify", *blobs)
    assert intact.returncode == 0, intact.stderr[-3000:]
    head = store.check_audit().head
    assert f"audit head: entry 4, hash {head.hash}" in intact.stdout
    assert f"normbridge audit --verify --expect-head {head.hash}" in intact.stdout
    answer = json.loads(cli(url, "audit", "--verify", "--json", *blobs).stdout)
    assert answer["chain_ok"] is True and answer["head"] == {"seq": 4, "hash": head.hash}

    as_attacker(store, "DELETE FROM audit_log WHERE seq > 3")
    for args in (("audit", "--verify"), ("verify", "--no-check")):
        run = cli(url, *args, *blobs, process=args[0] == "audit")  # one real process: its exit status on a cut log
        assert run.returncode == 12, (args, run.stdout, run.stderr[-2000:])
        assert "the audit log ends at entry 3 but its head says 4" in " ".join(run.stdout.split())

    as_attacker(store, "UPDATE audit_head SET seq = 3, hash = (SELECT hash FROM audit_log WHERE seq = 3)")
    assert cli(url, "audit", "--verify", *blobs).returncode == 0  # the rewrite is consistent ...
    pinned = cli(url, "audit", "--verify", "--expect-head", head.hash, *blobs)  # ... but the pinned head is gone
    assert pinned.returncode == 12 and f"the pinned audit head {head.hash[:12]}... is not in the audit log" in " ".join(
        pinned.stdout.split()
    )
    bad = cli(url, "audit", "--expect-head", "abc123", *blobs)
    assert bad.returncode == 14 and "is not an entry hash" in bad.stderr + bad.stdout
    store.close()


def test_a_registry_from_before_the_head_gets_the_head_of_its_chain_at_upgrade(url):
    engine = make_engine(url)
    with engine.connect() as connection:  # the schema as normbridge left it before this migration
        command.upgrade(alembic_config(connection), "0002")
        connection.commit()
    prev, rows = GENESIS, []
    for seq, action in enumerate(("register", "alias", "register_failed"), start=1):
        at = datetime(2026, 11, 30, 12, 0, seq)
        digest = entry_hash(prev, entry_payload(seq, at, "old", action, "cnn", None, {"n": seq}))
        rows.append(
            {
                "seq": seq,
                "at": at,
                "user": "old",
                "action": action,
                "model": "cnn",
                "number": None,
                "detail": json.dumps({"n": seq}),
                "prev_hash": prev,
                "hash": digest,
            }
        )
        prev = digest
    with engine.begin() as connection:
        connection.execute(
            text(
                'INSERT INTO audit_log (seq, at, "user", action, model, number, detail, prev_hash, hash) '
                "VALUES (:seq, :at, :user, :action, :model, :number, :detail, :prev_hash, :hash)"
            ),
            rows,
        )
    engine.dispose()

    store = MetadataStore(url)  # upgrades to head
    check = store.check_audit()
    assert check.problems == [] and (check.head.seq, check.head.hash) == (3, prev)
    store.record_failure("cnn", "new", {"reason": "after the upgrade"})
    assert store.check_audit().problems == [] and [e.prev_hash for e in store.audit()][-1] == prev
    as_attacker(store, "DELETE FROM audit_log WHERE seq = 4")
    assert store.verify_audit()[0].startswith("the audit log ends at entry 3 but its head says 4")
    store.close()
