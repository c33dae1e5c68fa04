"""Load: concurrent readers and writers against one `normbridge serve` (two worker processes, SQLite, local blobs).

Writers register new contents while readers list versions, show versions and download bundles
of versions already acknowledged. The run is bounded (a fixed number of registrations, a time
cap) and only talks to 127.0.0.1. Afterwards nothing is lost or duplicated: every acknowledged
version is present with its digest, the count matches the acknowledgements, numbers are 1..n,
every bundle re-hashes to its manifest, the audit chain verifies, and no request got a 5xx.
"""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest

from tests.http_server import create_token, running_server
from tests.registry.test_service_scale import bearer, bn_onnx_bytes, check_bundle, post_model, server_failures

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

WRITERS = 3
PER_WRITER = 6
READERS = 4
TIME_CAP = 150.0  # seconds: the run stops by itself even if the server hangs


def test_concurrent_readers_and_writers_lose_nothing_and_never_fail(tmp_path):
    db = f"sqlite:///{tmp_path / 'registry.db'}"
    writer_token = create_token(db, "writer", "write")
    reader_token = create_token(db, "reader", "read")
    with running_server(
        db=db, blobs=str(tmp_path / "blobs"), args=["--workers", "2"], log=tmp_path / "server.log"
    ) as server:
        with httpx.Client() as client:
            first = post_model(client, server.url, writer_token, "load", bn_onnx_bytes(1))
        assert first.status_code == 201, first.text
        acknowledged = {1: first.json()["version"]["digest"]}  # number -> digest, as the writers were told
        lock = threading.Lock()
        server_errors: list[str] = []
        read_problems: list[str] = []
        reads = {"versions": 0, "show": 0, "bundle": 0}
        deadline = time.monotonic() + TIME_CAP
        writers_done = threading.Event()

        def writer(index: int) -> None:
            with httpx.Client() as client:
                for k in range(PER_WRITER):
                    if time.monotonic() > deadline:
                        return
                    response = post_model(
                        client, server.url, writer_token, "load", bn_onnx_bytes(1000 * (index + 1) + k)
                    )
                    with lock:
                        if response.status_code >= 500:
                            server_errors.append(f"POST {response.status_code} {response.text[:500]}")
                        elif response.status_code != 201:
                            read_problems.append(
                                f"writer {index}: POST answered {response.status_code} {response.text[:500]}"
                            )
                        else:
                            version = response.json()["version"]
                            if version["number"] in acknowledged:
                                read_problems.append(f"number {version['number']} acknowledged twice")
                            acknowledged[version["number"]] = version["digest"]

        def reader(index: int) -> None:
            rng = random.Random(index)
            with httpx.Client(headers=bearer(reader_token), timeout=60) as client:
                while not writers_done.is_set() and time.monotonic() < deadline:
                    with lock:
                        number, digest = rng.choice(sorted(acknowledged.items()))
                    kind = ("versions", "show", "bundle")[rng.randrange(3)]
                    path = {
                        "versions": "/api/v1/models/load/versions",
                        "show": f"/api/v1/models/load/versions/{number}",
                        "bundle": f"/api/v1/models/load/versions/{number}/bundle",
                    }[kind]
                    response = client.get(server.url + path)
                    problem = None
                    if response.status_code != 200:
                        problem = f"GET {path} answered {response.status_code} {response.text[:500]}"
                    elif kind == "versions":
                        listed = {v["number"]: v["digest"] for v in response.json()["versions"]}
                        if listed.get(number) != digest:
                            problem = f"versions listing lacks acknowledged {number} {digest}"
                    elif kind == "show":
                        if response.json()["digest"] != digest:
                            problem = f"show {number} gave digest {response.json()['digest']}, acknowledged {digest}"
                    else:
                        problem = check_bundle(response, "load", number, digest)
                    with lock:
                        reads[kind] += 1
                        if problem:
                            (server_errors if response.status_code >= 500 else read_problems).append(problem)

        writer_threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
        reader_threads = [threading.Thread(target=reader, args=(i,)) for i in range(READERS)]
        for thread in writer_threads + reader_threads:
            thread.start()
        for thread in writer_threads:
            thread.join(timeout=TIME_CAP + 60)
        writers_done.set()
        for thread in reader_threads:
            thread.join(timeout=60)

        assert server_errors == []
        assert read_problems == []
        assert len(acknowledged) == 1 + WRITERS * PER_WRITER, "a writer ran out of time"
        assert min(reads.values()) > 0, reads
        with httpx.Client(headers=bearer(reader_token), timeout=60) as client:
            versions = client.get(f"{server.url}/api/v1/models/load/versions").json()["versions"]
            assert {v["number"]: v["digest"] for v in versions} == acknowledged
            assert [v["number"] for v in versions] == list(range(1, len(acknowledged) + 1))
            audit = client.get(f"{server.url}/api/v1/audit", params={"model": "load", "verify": "true"}).json()
            assert audit["chain_ok"] is True, audit["chain_problems"]
            assert sorted(e["number"] for e in audit["entries"] if e["action"] == "register") == sorted(acknowledged)
            verified = client.post(f"{server.url}/api/v1/verify", params={"check": "false"}).json()
            assert verified["passed"] is True, verified
        assert server_failures(server.log_text()) == []
