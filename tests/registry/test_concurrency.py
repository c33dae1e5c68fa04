"""Eight processes registering versions of one model at once get versions 1..8: no gap, no duplicate.

Each worker is a separate interpreter (multiprocessing 'spawn') with its own MetadataStore,
released together by a barrier, so the writers really race for the number counter. The
database is fresh, so the workers also race through the Alembic upgrade (serialised by an
advisory lock on PostgreSQL and BEGIN IMMEDIATE on SQLite).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import sqlite3

from registry.metadata import MetadataStore
from tests.pg import fresh_database

WORKERS = 8


def _register(url: str, index: int, barrier, results) -> None:
    try:
        store = MetadataStore(url)
        barrier.wait(timeout=120)
        content = hashlib.sha256(f"worker {index}".encode()).hexdigest()
        record, created = store.add_version(
            "shared",
            hashlib.sha256(f"artifact {index}".encode()).hexdigest(),
            content,
            {"worker": index},
            [content],
            None,
            "registered",
            None,
            f"worker-{index}",
        )
        store.close()
        results.put((index, record.number, created))
    except BaseException as error:  # noqa: BLE001 - reported to the parent, which fails the test with it
        results.put((index, None, f"{type(error).__name__}: {error}"))


def _race(url: str) -> list[tuple[int, int, bool]]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(WORKERS)
    results = context.Queue()
    processes = [context.Process(target=_register, args=(url, i, barrier, results)) for i in range(WORKERS)]
    for process in processes:
        process.start()
    collected = [results.get(timeout=180) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    return collected


def _check(url: str, collected) -> MetadataStore:
    errors = [outcome for _, number, outcome in collected if number is None]
    assert errors == []
    assert sorted(number for _, number, _ in collected) == list(range(1, WORKERS + 1))
    assert all(created is True for _, _, created in collected)
    store = MetadataStore(url)
    versions = store.versions("shared")
    assert [v.number for v in versions] == list(range(1, WORKERS + 1))
    by_worker = {index: number for index, number, _ in collected}
    assert {v.manifest["worker"]: v.number for v in versions} == by_worker
    assert store.models() == [("shared", WORKERS, WORKERS)]
    audit = store.audit("shared")
    assert sorted(e.number for e in audit if e.action == "register") == list(range(1, WORKERS + 1))
    assert store.verify_audit() == []
    return store


def test_eight_processes_on_postgresql():
    with fresh_database() as url:
        store = _check(url, _race(url))
        store.close()


def test_eight_processes_on_sqlite(tmp_path):
    path = tmp_path / "registry.db"
    url = f"sqlite:///{path}"
    store = _check(url, _race(url))
    store.close()
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
