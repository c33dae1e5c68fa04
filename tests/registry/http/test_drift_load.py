"""A bounded load run of the drift history: many concurrent senders against two `normbridge serve` processes on one
PostgreSQL database. Nothing is lost, nothing fails, and the incremental state matches the stored windows exactly.

Printed (not asserted beyond a generous bound): the POST latency percentiles, quoted in docs/monitoring.md.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.db.drift_rows import DriftLayerRow, DriftWindowRow
from registry.drift_history import history
from tests.http_server import create_token, running_server
from tests.pg import fresh_database
from tests.registry.test_drift_history import window
from testkit.monitoring_models import torch_cnn

pytestmark = pytest.mark.slow

SENDERS = 16
PER_SENDER = 15
TIME_CAP = 240.0  # seconds: the run stops by itself


def test_concurrent_senders_on_two_servers_lose_nothing_and_keep_the_state_exact(tmp_path):
    from registry.service import Registry

    with fresh_database() as db:
        blobs = str(tmp_path / "blobs")
        model = torch_cnn()
        registry = Registry(db=db, blobs=blobs, user="ci")
        registry.register("cnn", model)
        token = create_token(db, "fleet", "write", ["cnn"])
        bodies = [window(model, shift_sd=2.0 if i % 3 == 0 else 0.0) for i in range(PER_SENDER)]
        with (
            running_server(db=db, blobs=blobs, log=tmp_path / "a.log") as a,
            running_server(db=db, blobs=blobs, log=tmp_path / "b.log") as b,
        ):
            latencies, failures, lock = [], [], threading.Lock()
            deadline = time.monotonic() + TIME_CAP

            def sender(index: int) -> None:
                url = f"{(a, b)[index % 2].url}/api/v1/models/cnn/versions/1/drift"
                with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
                    for body in bodies:
                        if time.monotonic() > deadline:
                            return
                        start = time.perf_counter()
                        answer = client.post(url, json={**body, "replica": f"replica-{index}"})
                        with lock:
                            latencies.append(time.perf_counter() - start)
                            if answer.status_code != 201:
                                failures.append(f"{answer.status_code}: {answer.text[:200]}")

            with ThreadPoolExecutor(SENDERS) as pool:
                list(pool.map(sender, range(SENDERS)))
        assert not failures, failures[:5]
        assert len(latencies) == SENDERS * PER_SENDER  # the time cap was not reached
        p50, p99 = (float(np.percentile(latencies, q)) * 1000 for q in (50, 99))
        print(
            f"\nPOST .../drift: {len(latencies)} windows from {SENDERS} senders on 2 servers (PostgreSQL): p50 {p50:.0f} ms, p99 {p99:.0f} ms"
        )
        assert p99 < 10_000

        found = history(registry, "cnn@1", limit=10_000)
        assert found.windows_total == len(found.windows) == SENDERS * PER_SENDER
        by_id = sorted(found.windows, key=lambda w: w.id)
        assert found.recent == "".join("1" if w.over else "0" for w in by_id[-found.rule.m :])
        for index, record in enumerate(by_id):  # each stored state is the rule applied to the windows stored before it
            recent = "".join("1" if w.over else "0" for w in by_id[max(0, index - found.rule.m + 1) : index + 1])
            assert record.state == found.rule.state_of(recent), (index, recent, record.state)
        with Session(registry.meta.engine) as session:
            assert session.scalar(select(func.count()).select_from(DriftLayerRow)) == 2 * SENDERS * PER_SENDER
            assert session.scalar(select(func.count(func.distinct(DriftWindowRow.replica)))) == SENDERS
        registry.meta.close()
