"""Drift windows the schema used to accept and the store could not hold, and windows sent twice, against a real
`normbridge serve` on SQLite and on PostgreSQL.

Issue 30, hole 9: a window mixing a time without a UTC offset with one that has it, a start of
0001-01-01T00:00:00+05:00 or an end of 9999-12-31T23:00:00-05:00 (both outside the years 1-9999 in UTC), or a
count, requests or dropped of 2^63 or more each ended in a 500 (a comparison TypeError, an OverflowError, an integer the
database column cannot hold). Each must be a 422 naming the field, with nothing stored. And a window posted again (a
retry, a replay) was stored and counted again, moving the version's state twice: the same window must count once.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import httpx
import pytest

from registry.drift_history import history
from tests.http_server import create_token, running_server
from tests.pg import fresh_database
from tests.registry.test_drift_history import window
from testkit.monitoring_models import torch_cnn

pytestmark = pytest.mark.slow  # starts a server

PATH = "/api/v1/models/cnn/versions/1/drift"


@contextmanager
def database(backend: str, root):
    if backend == "sqlite":
        yield f"sqlite:///{root / 'registry.db'}"
        return
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, tmp_path_factory):
    from registry.service import Registry

    root = tmp_path_factory.mktemp(f"windows-{request.param}")
    model = torch_cnn()
    with database(request.param, root) as db:
        blobs = str(root / "blobs")
        registry = Registry(db=db, blobs=blobs, user="ci")
        registry.register("cnn", model)
        token = create_token(db, "collector", "write", ["cnn"])
        try:
            with running_server(db=db, blobs=blobs, log=root / "serve.log") as server:
                with httpx.Client(
                    base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=120
                ) as client:
                    yield client, registry, model
        finally:
            registry.meta.close()


def _with(body: dict, **changes) -> dict:
    body = copy.deepcopy(body)
    for key, value in changes.items():
        if key == "count":
            body["layers"][0]["count"] = value
        else:
            body[key] = value
    return body


BIG = 2**63


@pytest.mark.parametrize(
    "field, changes",
    [
        ("started_at", {"started_at": "2026-01-01T00:00:00"}),  # no offset, beside an ended_at that has one
        ("ended_at", {"started_at": "2026-01-01T00:00:00+00:00", "ended_at": "2099-01-01T00:00:00"}),
        ("started_at", {"started_at": "0001-01-01T00:00:00+05:00"}),  # year 0 in UTC
        ("ended_at", {"ended_at": "9999-12-31T23:00:00-05:00"}),  # year 10000 in UTC
        ("count", {"count": BIG}),
        ("requests", {"requests": BIG}),
        ("dropped", {"dropped": BIG}),
        ("sampled", {"sampled": BIG + 5}),
        ("requests", {"requests": 10**30}),
    ],
    ids=[
        "naive-start",
        "naive-end",
        "year-0",
        "year-10000",
        "count",
        "requests",
        "dropped",
        "sampled",
        "requests-huge",
    ],
)
def test_a_window_the_store_cannot_hold_is_a_422_naming_the_field(served, field, changes):
    client, registry, model = served
    before = history(registry, "cnn@1").windows_total
    answer = client.post(PATH, json=_with(window(model), **changes))
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and field in error["message"], error
    assert history(registry, "cnn@1").windows_total == before


def test_the_largest_values_the_store_holds_are_stored(served):
    client, registry, model = served
    body = _with(
        window(model),
        count=BIG - 1,
        requests=BIG - 1,
        dropped=BIG - 1,
        sampled=BIG - 1,
        started_at="0001-01-01T00:00:00+00:00",
        ended_at="9999-12-31T23:59:59-00:00",
    )
    answer = client.post(PATH, json=body)
    assert answer.status_code == 201, answer.text
    stored = history(registry, "cnn@1", limit=1).windows[0]
    assert (stored.requests, stored.dropped, stored.sampled, stored.layers[0].count) == (BIG - 1,) * 4
    assert stored.started_at.year == 1 and stored.ended_at.year == 9999


def test_a_window_posted_twice_counts_once(served):
    client, registry, model = served
    body = window(model, shift_sd=2.0)  # over threshold: a replay would move the state a second time
    before = history(registry, "cnn@1")
    first = client.post(PATH, json=body)
    assert first.status_code == 201, first.text
    replays = [client.post(PATH, json=body) for _ in range(3)]
    # the same content written differently (key order, an equal time in another offset) is the same window
    shifted_offset = {**body, "started_at": body["started_at"].replace("+00:00", "Z")}
    replays.append(client.post(PATH, json=dict(reversed(list(shifted_offset.items())))))
    for replay in replays:
        assert replay.status_code == 200, replay.text
        assert replay.json() == first.json()
    after = history(registry, "cnn@1")
    assert after.windows_total == before.windows_total + 1
    assert after.recent == (before.recent + "1")[-after.rule.m :]
    assert [w.id for w in after.windows].count(first.json()["id"]) == 1
    # another window (another replica, the same figures) is another window
    other = client.post(PATH, json={**body, "replica": "another:1"})
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert history(registry, "cnn@1").windows_total == before.windows_total + 2
