"""Scale-out: two `normbridge serve` processes on one PostgreSQL database and one S3 bucket, registering at once.

Threads POST uploads to alternating servers: distinct contents, and every content twice (once
to each server, racing). Afterwards each content is exactly one version, numbers are 1..n per
model with no gap or duplicate, every referenced blob is in S3 and re-hashes right
(Registry.verify), the audit chain verifies and names the token owner of the request that
created each version, and each server reads what the other wrote. Real processes, real HTTP,
real PostgreSQL, real S3 protocol (moto server): nothing is mocked.

Also holds the small helpers the other service tests share (a one-layer ONNX model, uploads).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager

import httpx
import pytest
import numpy as np

from tests import moto_server
from tests.http_server import create_token, running_server
from tests.pg import fresh_database

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

moto_s3 = moto_server.moto_s3
s3_env = moto_server.s3_env


# ---------------------------------------------------------------------------- shared helpers


def bn_onnx_bytes(seed: int, channels: int = 8, layers: int = 1) -> bytes:
    """An ONNX model of `layers` chained eval-mode BatchNormalization nodes with statistics drawn from `seed`.

    Different seeds give different contents (new versions); the same seed gives the same bytes.
    """
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, initializers = [], []
    current = "X"
    for i in range(layers):
        names = [f"s{i}", f"b{i}", f"m{i}", f"v{i}"]
        arrays = (
            rng.uniform(0.5, 1.5, channels),
            rng.normal(size=channels),
            rng.normal(size=channels),
            rng.uniform(0.5, 2.0, channels),
        )
        initializers += [numpy_helper.from_array(a.astype(np.float32), n) for a, n in zip(arrays, names)]
        output = "Y" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("BatchNormalization", [current, *names], [output], epsilon=1e-5, name=f"bn{i}"))
        current = output
    shape = ["N", channels, "H", "W"]
    graph = helper.make_graph(
        nodes,
        "bn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)],
        initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]).SerializeToString()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def post_model(
    client: httpx.Client, url: str, token: str, name: str, data, fmt: str = "onnx", **params
) -> httpx.Response:
    """POST /api/v1/models/{name}/versions with the raw file as the body."""
    return client.post(
        f"{url}/api/v1/models/{name}/versions",
        params={"format": fmt, **params},
        content=data,
        headers={**bearer(token), "Content-Type": "application/octet-stream"},
        timeout=300,
    )


def check_bundle(response: httpx.Response, name: str, number: int, digest: str) -> str | None:
    """None when the tar is the version's artifact folder and every blob hashes to its name; else what is wrong."""
    if (
        response.headers.get("x-normbridge-version") != f"{name}@{number}"
        or response.headers.get("x-normbridge-digest") != digest
    ):
        return f"bundle headers {dict(response.headers)} do not name {name}@{number} {digest}"
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}
    manifest = json.loads(members.pop("manifest.json"))
    parts = (manifest.get("structure") or {}).get("parts", {})  # the model's structure blobs travel beside its tensors
    wanted = {t["digest"] for t in [*manifest["tensors"].values(), *parts.values()]}
    if {f"blobs/{d}.safetensors" for d in wanted} != set(members):
        return f"bundle members {sorted(members)} are not the manifest's blobs"
    for member, data in members.items():
        if hashlib.sha256(data).hexdigest() != member.removeprefix("blobs/").removesuffix(".safetensors"):
            return f"bundle member {member} does not hash to its name"
    return None


def server_failures(log: str) -> list[str]:
    """Lines of a `normbridge serve` log that show a request it failed (a 5xx answer or an unexpected exception)."""
    return [line for line in log.splitlines() if "unexpected error on" in line or re.search(r'HTTP/1\.1" 5\d\d ', line)]


def s3_server_env(endpoint: str) -> dict[str, str]:
    """What a server process needs to reach the moto S3 server (tests/moto_server.py sets the same in-process)."""
    return {
        "NORMBRIDGE_S3_ENDPOINT": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


# ---------------------------------------------------------------------------- the test

MODELS = ("alpha", "beta")
DISTINCT = 5  # distinct contents per model; each is uploaded twice, once to each server
SHARED_SEED = 999  # one content registered under both models (its blobs are shared in S3)


def test_two_servers_on_one_database_and_bucket_register_concurrently(s3_env, tmp_path):
    endpoint, bucket, s3 = s3_env
    blobs = f"s3://{bucket}/registry"
    env = s3_server_env(endpoint)
    with fresh_database() as db, ExitStack() as stack:
        owners = ("alice", "bob")
        tokens = [create_token(db, owner, "write") for owner in owners]
        reader = create_token(db, "auditor", "read")
        servers = [
            stack.enter_context(running_server(db=db, blobs=blobs, env=env, log=tmp_path / f"server-{i}.log"))
            for i in range(2)
        ]

        def warm(i: int) -> httpx.Response:
            # each server imports the gate's frameworks once; both warm-ups race for version numbers of 'warm'
            with httpx.Client() as client:
                return post_model(client, servers[i].url, tokens[i], "warm", bn_onnx_bytes(10_000 + i))

        with ThreadPoolExecutor(2) as pool:
            warmed = list(pool.map(warm, range(2)))
        assert [r.status_code for r in warmed] == [201, 201], [r.text for r in warmed]
        assert sorted(r.json()["version"]["number"] for r in warmed) == [1, 2]

        # every (model, seed) twice, the two copies released together (a barrier) to different servers, so they
        # race through the gate and for the version number; the pairs of both models interleave
        jobs = []
        for k in range(DISTINCT):
            for m, model in enumerate(MODELS):
                pair = threading.Barrier(2)
                seed = 100 * (m + 1) + k
                jobs += [(model, seed, 0, pair), (model, seed, 1, pair)]
        jobs += [(model, SHARED_SEED, m, None) for m, model in enumerate(MODELS)]
        lock = threading.Lock()
        answers: list[tuple[str, int, int, int, dict]] = []
        local = threading.local()

        def send(job) -> None:
            model, seed, server, pair = job
            if not hasattr(local, "client"):
                local.client = httpx.Client()
            data = bn_onnx_bytes(seed)
            if pair is not None:
                pair.wait(timeout=120)
            response = post_model(local.client, servers[server].url, tokens[server], model, data)
            with lock:
                answers.append((model, seed, server, response.status_code, response.json()))

        with ThreadPoolExecutor(6) as pool:  # an even number of threads: both copies of a pair always get one
            list(pool.map(send, jobs))

        failures = [(m, s, srv, status, body) for m, s, srv, status, body in answers if status not in (200, 201)]
        assert failures == []
        by_content: dict[tuple[str, int], list] = {}
        for model, seed, server, status, body in answers:
            assert (status == 201) == body["created"], body
            by_content.setdefault((model, seed), []).append((server, body))

        created_by: dict[tuple[str, int], str] = {}  # (model, number) -> owner of the token whose request created it
        acknowledged: dict[tuple[str, int], dict] = {}
        for (model, seed), copies in by_content.items():
            numbers = {body["version"]["number"] for _, body in copies}
            assert len(numbers) == 1, f"{model} seed {seed} got several versions: {numbers}"
            creators = [server for server, body in copies if body["created"]]
            assert len(creators) == 1, f"{model} seed {seed} was created {len(creators)} times"
            number = numbers.pop()
            created_by[(model, number)] = owners[creators[0]]
            version = next(body["version"] for _, body in copies if body["created"])
            assert all(body["version"]["digest"] == version["digest"] for _, body in copies)
            acknowledged[(model, number)] = version

        with httpx.Client(headers=bearer(reader), timeout=60) as client:
            # numbers contiguous per model, every acknowledged version present once, both servers agree
            for model in MODELS:
                listings = [client.get(f"{s.url}/api/v1/models/{model}/versions") for s in servers]
                assert [r.status_code for r in listings] == [200, 200]
                versions = listings[0].json()["versions"]
                assert listings[1].json()["versions"] == versions
                assert [v["number"] for v in versions] == list(range(1, DISTINCT + 2))
                assert len({v["content_digest"] for v in versions}) == len(versions)
                for v in versions:
                    assert acknowledged[(model, v["number"])]["digest"] == v["digest"]
                    assert v["user"] == created_by[(model, v["number"])]
            summary = {m["name"]: m for m in client.get(f"{servers[1].url}/api/v1/models").json()}
            assert {name: (m["latest"], m["versions"]) for name, m in summary.items()} == {
                "warm": (2, 2),
                "alpha": (DISTINCT + 1, DISTINCT + 1),
                "beta": (DISTINCT + 1, DISTINCT + 1),
            }

            # each server serves the blobs and bundles the other one wrote, byte-exact
            for (model, number), version in sorted(acknowledged.items()):
                other = servers[1 - owners.index(created_by[(model, number)])]
                digest = next(iter(version["manifest"]["tensors"].values()))["digest"]
                blob = client.get(f"{other.url}/api/v1/blobs/{digest}")
                assert blob.status_code == 200 and hashlib.sha256(blob.content).hexdigest() == digest
                assert blob.headers["x-normbridge-sha256"] == digest
                shown = client.get(f"{other.url}/api/v1/models/{model}/versions/{number}")
                assert shown.status_code == 200 and shown.json()["digest"] == version["digest"]
                bundle = client.get(f"{other.url}/api/v1/models/{model}/versions/{number}/bundle")
                assert bundle.status_code == 200 and check_bundle(bundle, model, number, version["digest"]) is None

            audit = client.get(f"{servers[0].url}/api/v1/audit", params={"verify": "true"}).json()
            assert audit["chain_ok"] is True, audit["chain_problems"]
            registrations = [
                (e["model"], e["number"], e["user"]) for e in audit["entries"] if e["action"] == "register"
            ]
            assert sorted(registrations) == sorted(
                [(m, n, owner) for (m, n), owner in created_by.items()]
                + [("warm", r.json()["version"]["number"], owners[i]) for i, r in enumerate(warmed)]
            )

        # the library on the same database and bucket: every referenced blob is in S3 and hashes right, chain intact
        from registry.service import Registry

        registry = Registry(db=db, blobs=blobs, user="checker")
        result = registry.verify(rerun_checks=False)
        assert result.passed, result.render_text()
        assert len(result.versions) == 2 + 2 * (DISTINCT + 1)
        referenced = {
            t["digest"]
            for name, _, _ in registry.models()
            for record in registry.versions(name)
            for t in record.manifest["tensors"].values()
        }
        assert referenced and referenced <= set(registry.store.digests())
        keys = {
            o["Key"]
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="registry/")
            for o in page.get("Contents", [])
        }
        assert {f"registry/{d[:2]}/{d[2:]}" for d in referenced} <= keys
        assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
        registry.meta.close()
        for server in servers:
            assert server_failures(server.log_text()) == []


def test_the_same_bundle_streamed_to_two_servers_on_s3_is_stored_once(s3_env, tmp_path):
    """`normbridge --server` uploads of one artifact folder to both servers at once: both gate it while it streams
    in and stage its blobs in the shared bucket; one creates the version, the other answers with it."""
    import onnx

    from registry.artifact import extract_artifact
    from registry.manifest_io import save_artifact_folder
    from registry.client import RemoteRegistry
    from registry.service import Registry

    endpoint, bucket, s3 = s3_env
    blobs = f"s3://{bucket}/registry"
    folder = save_artifact_folder(
        extract_artifact(onnx.load_from_string(bn_onnx_bytes(77, channels=50_000, layers=6))), tmp_path / "artifact"
    )
    with fresh_database() as db, ExitStack() as stack:
        tokens = [create_token(db, owner, "write") for owner in ("alice", "bob")]
        servers = [
            stack.enter_context(
                running_server(db=db, blobs=blobs, env=s3_server_env(endpoint), log=tmp_path / f"s{i}.log")
            )
            for i in range(2)
        ]
        start = threading.Barrier(2)

        def upload(i: int):
            with RemoteRegistry(servers[i].url, tokens[i]) as remote:
                start.wait(timeout=60)
                return remote.register("streamed", folder)

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(upload, range(2)))
        assert sorted(r.created for r in results) == [False, True]
        assert {(r.version.number, r.version.digest) for r in results} == {(1, results[0].version.digest)}
        assert all(len(r.checks) == 6 and all(c.passed for c in r.checks) for r in results)
        registry = Registry(db=db, blobs=blobs, user="checker")
        assert registry.verify(rerun_checks=False).passed
        manifest = registry.manifest("streamed@1")
        parts = manifest.structure.parts.values() if manifest.structure is not None else ()
        referenced = {
            ref.digest for ref in [*manifest.tensors.values(), *parts]
        }  # tensors and the graph's structure blobs
        assert referenced == set(registry.store.digests())  # each blob once in the bucket, nothing else
        from registry.manifest_io import load_artifact_folder

        sent = load_artifact_folder(folder)
        with RemoteRegistry(servers[1].url, tokens[1]) as remote:  # the bundle download is re-hashed by the client
            served = remote.tensors("streamed@1")
        assert {name: array.tobytes() for name, array in served.items()} == {
            name: sent.blobs[ref.digest][len(sent.blobs[ref.digest]) - ref.nbytes :]
            for name, ref in sent.manifest.tensors.items()
        }

        # a statistics-only fine-tune of a torch CNN: its weights are left out, checked on S3 from their stored headers
        from registry.client_transfer import folder_tar_size
        from tests.registry.test_registry_service import finetune_statistics, trained_cnn

        base = save_artifact_folder(extract_artifact(trained_cnn(seed=5)), tmp_path / "cnn")
        tuned = save_artifact_folder(
            extract_artifact(finetune_statistics(trained_cnn(seed=5), seed=6)), tmp_path / "cnn-tuned"
        )
        sizes: dict[str, int] = {}

        @contextmanager
        def transfer(description, total):
            sizes[description] = total
            yield lambda done: None

        with RemoteRegistry(servers[0].url, tokens[0], transfer=transfer) as remote:
            assert remote.register("cnn", base).created
            shared = frozenset(load_artifact_folder(base).blobs) & frozenset(load_artifact_folder(tuned).blobs)
            assert remote.register("cnn", tuned, operation="fine-tuned").created
        assert shared and sizes["uploading cnn-tuned"] == folder_tar_size(tuned, shared) < folder_tar_size(tuned)
        assert registry.verify(rerun_checks=False).passed
        for server in servers:
            assert server_failures(server.log_text()) == [], server.log_text()[-3000:]
