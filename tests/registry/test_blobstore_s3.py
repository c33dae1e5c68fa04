"""The S3 blob store against a real HTTP server (moto in server mode, tests/moto_server.py): no boto3 mocking."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry.blobs import open_blob_store
from registry.blobs.s3 import S3BlobStore
from schemas.errors import IntegrityError, NotFoundError, RegistryError
from tests import moto_server

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

moto_s3 = moto_server.moto_s3  # fixtures: a moto server on a free port, and a fresh bucket per test
s3_env = moto_server.s3_env

MiB = 1024 * 1024


def test_put_get_round_trip_with_sharded_keys_and_sha256_metadata(s3_env):
    _, bucket, client = s3_env
    store = open_blob_store(f"s3://{bucket}/models/blobs")
    assert isinstance(store, S3BlobStore) and store.uri == f"s3://{bucket}/models/blobs"
    data = b"running statistics"
    digest = store.put(data)
    assert digest == hashlib.sha256(data).hexdigest()
    key = f"models/blobs/{digest[:2]}/{digest[2:]}"
    head = client.head_object(Bucket=bucket, Key=key)
    assert head["Metadata"] == {"sha256": digest} and head["ContentLength"] == len(data)
    assert store.get(digest) == data
    assert store.exists(digest) and store.size(digest) == len(data)
    assert 0.0 <= store.age_seconds(digest) < 60.0
    assert list(store.digests()) == [digest]


def test_put_is_idempotent_and_does_not_resend_a_present_large_blob(s3_env):
    from registry.blobs.s3 import ASK_FIRST_BYTES

    _, bucket, client = s3_env
    store = open_blob_store(f"s3://{bucket}/p")
    large, small = b"x" * (ASK_FIRST_BYTES + 1000), b"y" * 1000
    first, second = store.put(large), store.put(small)
    modified = client.head_object(Bucket=bucket, Key=store.key_of(first))["LastModified"]
    calls = []
    original = store.client.put_object
    store.client.put_object = lambda **kw: calls.append(kw["Key"]) or original(**kw)
    assert store.put(large) == first
    assert store.publish(store.stage(large)) == first
    assert calls == []  # HEAD found it: nothing uploaded again
    assert client.head_object(Bucket=bucket, Key=store.key_of(first))["LastModified"] == modified
    # a small blob is sent without asking first: the same bytes again under the same key
    assert store.put(small) == second and calls == [store.key_of(second)]
    assert store.get(second) == small
    listed = client.list_objects_v2(Bucket=bucket)["Contents"]
    assert sorted(o["Key"] for o in listed) == sorted([store.key_of(first), store.key_of(second)])


def test_a_large_blob_is_uploaded_in_parts_and_read_back(s3_env):
    _, bucket, client = s3_env
    store = S3BlobStore.from_uri(f"s3://{bucket}/big", multipart_threshold=5 * MiB, part_size=5 * MiB)
    data = os.urandom(12 * MiB)
    digest = store.put(data)
    head = client.head_object(Bucket=bucket, Key=store.key_of(digest))
    assert head["ETag"].strip('"').endswith("-3")  # three parts: 5 + 5 + 2 MiB
    assert head["Metadata"] == {"sha256": digest} and store.size(digest) == len(data)
    assert store.get(digest) == data
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_a_failed_multipart_upload_leaves_no_object_and_no_pending_upload(s3_env, monkeypatch):
    _, bucket, client = s3_env
    store = S3BlobStore.from_uri(f"s3://{bucket}", multipart_threshold=5 * MiB, part_size=5 * MiB)
    original = store._upload_part

    def failing(key, upload_id, number, chunk):
        if number == 2:
            raise OSError("connection reset (injected)")
        return original(key, upload_id, number, chunk)

    monkeypatch.setattr(store, "_upload_part", failing)
    data = os.urandom(11 * MiB)
    with pytest.raises(OSError, match="injected"):
        store.put(data)
    assert list(store.digests()) == [] and not store.exists(hashlib.sha256(data).hexdigest())
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_gc_aborts_multipart_uploads_left_by_a_crashed_writer(s3_env):
    _, bucket, client = s3_env
    store = open_blob_store(f"s3://{bucket}/reg")
    client.create_multipart_upload(Bucket=bucket, Key=store.key_of("ab" * 32))
    client.create_multipart_upload(Bucket=bucket, Key="elsewhere/ab/cd")  # outside the prefix: not ours
    # (moto reports every upload as initiated in 2010, so the grace period cannot be exercised here)
    asked: list[str] = []
    assert (
        store.remove_stale_staging(0, keep=lambda digest: asked.append(digest) or digest == "ab" * 32) == 0
    )  # a leased digest's upload
    assert asked == ["ab" * 32]
    assert store.remove_stale_staging(0) == 1
    assert [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket)["Uploads"]] == ["elsewhere/ab/cd"]


def test_get_refuses_an_object_whose_bytes_were_overwritten(s3_env):
    _, bucket, client = s3_env
    store = open_blob_store(f"s3://{bucket}/p")
    digest = store.put(b"weights")
    client.put_object(Bucket=bucket, Key=store.key_of(digest), Body=b"weightz", Metadata={"sha256": digest})
    with pytest.raises(
        IntegrityError, match=f"blob {digest} .* now hashes to {hashlib.sha256(b'weightz').hexdigest()}"
    ):
        store.get(digest)
    assert store.exists(digest)


def test_absent_blobs_bad_digests_and_a_missing_bucket(s3_env):
    _, bucket, _ = s3_env
    store = open_blob_store(f"s3://{bucket}")
    missing = hashlib.sha256(b"never stored").hexdigest()
    assert not store.exists(missing)
    with pytest.raises(NotFoundError, match=missing):
        store.get(missing)
    with pytest.raises(NotFoundError):
        store.size(missing)
    with pytest.raises(NotFoundError):
        store.age_seconds(missing)
    store.delete(missing)  # absent: not an error
    with pytest.raises(RegistryError, match="64 lowercase hex"):
        store.get("../../etc/passwd")
    with pytest.raises(RegistryError, match="does not exist"):
        open_blob_store("s3://no-such-bucket-nb/x").put(b"data")


def test_digests_pages_through_many_blobs_and_delete_removes_them(s3_env):
    _, bucket, client = s3_env
    store = open_blob_store(f"s3://{bucket}/reg")
    client.put_object(Bucket=bucket, Key="reg/README", Body=b"not a blob")
    client.put_object(Bucket=bucket, Key="other/ab/" + "c" * 62, Body=b"another prefix")
    store.list_page_size = 7
    calls = []
    original = store.client.list_objects_v2
    store.client.list_objects_v2 = lambda **kw: calls.append(kw) or original(**kw)
    digests = {store.put(str(i).encode()) for i in range(30)}
    assert set(store.digests()) == digests
    assert len(calls) >= 5  # 31 keys under the prefix, 7 per page
    drop = sorted(digests)[:3]
    for digest in drop:
        store.delete(digest)
    assert set(store.digests()) == digests - set(drop)


def test_open_blob_store_lists_s3_and_imports_boto3_only_for_s3(tmp_path):
    with pytest.raises(RegistryError, match="unknown scheme 'gs'; currently registered schemes are file, s3"):
        open_blob_store("gs://bucket/blobs")
    code = (
        "import sys; from registry.blobs import open_blob_store; "
        f"open_blob_store({str(tmp_path)!r}).put(b'x'); assert 'boto3' not in sys.modules, 'boto3 imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(Path(__file__).resolve().parents[2]))


def test_a_registry_on_s3_registers_verifies_and_collects_garbage(s3_env, tmp_path):
    from registry.service import Registry
    from tests.registry.test_registry_service import finetune_statistics, trained_cnn

    _, bucket, client = s3_env
    reg = Registry(db=f"sqlite:///{tmp_path / 'registry.db'}", blobs=f"s3://{bucket}/blobs", user="tester")
    assert isinstance(reg.store, S3BlobStore)
    model = trained_cnn()
    first = reg.register("cnn", model)
    assert first.created and first.version.number == 1
    finetune_statistics(model)
    second = reg.register("cnn", model)
    assert second.created and second.version.number == 2
    referenced = set(reg.store.digests())
    assert referenced == {t["digest"] for v in (first, second) for t in v.version.manifest["tensors"].values()}
    result = reg.verify()
    assert result.passed and result.blobs_checked > 0

    orphan = reg.store.put(b"left behind by a crashed registration")
    kept = reg.gc(grace_seconds=3600)
    assert kept.deleted == [] and kept.kept_young == [orphan]
    swept = reg.gc(grace_seconds=0)
    assert swept.deleted == [orphan] and set(reg.store.digests()) == referenced
    assert reg.verify(rerun_checks=False).passed

    digest = second.version.manifest["tensors"]["bn1.running_var"]["digest"]
    client.put_object(Bucket=bucket, Key=reg.store.key_of(digest), Body=b"tampered")
    problems = reg.verify().problems
    assert [(p.number, p.kind, p.tensor) for p in problems] == [(2, "blob", "bn1.running_var")]
    with pytest.raises(IntegrityError, match="bn1.running_var"):
        reg.tensors("cnn@2")


def test_each_put_carries_the_blobs_sha256_as_s3s_signed_checksum(s3_env):
    """S3 itself refuses a PUT whose body does not match x-amz-checksum-sha256 (moto does not check it, so the
    request is inspected here as it leaves botocore): the body is bound by that signed header, not by re-hashing it."""
    import base64

    _, bucket, _ = s3_env
    store = open_blob_store(f"s3://{bucket}/p")
    sent: list[dict] = []
    store.client.meta.events.register(
        "before-send.s3.PutObject", lambda request, **_: sent.append(dict(request.headers))
    )
    data = b"running statistics" * 100
    digest = store.put(data)
    assert len(sent) == 1
    headers = {k.lower(): (v.decode() if isinstance(v, bytes) else v) for k, v in sent[0].items()}
    assert headers["x-amz-checksum-sha256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()
    assert "x-amz-checksum-sha256" in headers["authorization"]  # among the signed headers
    assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    assert store.get(digest) == data


def test_head_of_reads_the_start_of_a_blob_and_its_whole_length_in_one_request(s3_env, tmp_path):
    _, bucket, _ = s3_env
    data = os.urandom(3000)
    for store in (open_blob_store(f"s3://{bucket}/p"), open_blob_store(str(tmp_path / "local"))):
        digest = store.put(data)
        assert store.head_of(digest, 10) == (data[:10], 3000)
        assert store.head_of(digest, 10_000) == (data, 3000)
        with pytest.raises(NotFoundError):
            store.head_of("0" * 64, 10)


def test_an_object_tampered_in_the_bucket_is_refused_by_every_reader_naming_its_tensor(s3_env, tmp_path):
    """Attack: overwrite a stored blob's bytes in the bucket (same length, same safetensors header, one bit of data
    flipped, the sha256 metadata kept), then read it through every door: the library (verify, tensors, export, pull) and
    a real `normbridge serve` on the same bucket (verify, blob GET, bundle GET, model GET, and the client's tensors,
    export and pull)."""
    import httpx

    from registry.client import RemoteRegistry
    from registry.service import Registry
    from tests.http_server import create_token, running_server
    from tests.registry.test_registry_service import trained_cnn

    _, bucket, client = s3_env
    db, blobs = f"sqlite:///{tmp_path / 'registry.db'}", f"s3://{bucket}/blobs"
    reg = Registry(db=db, blobs=blobs, user="tester")
    reg.register("cnn", trained_cnn())
    digest = reg.manifest("cnn@1").tensors["bn1.running_var"].digest
    key = reg.store.key_of(digest)
    original = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    tampered = bytearray(original)
    tampered[-1] ^= 0x01
    client.put_object(Bucket=bucket, Key=key, Body=bytes(tampered), Metadata={"sha256": digest})
    assert reg.store.head_of(digest, 64) == (
        bytes(tampered[:64]),
        len(original),
    )  # nothing but the hash tells them apart

    assert [(p.number, p.kind, p.tensor) for p in reg.verify().problems] == [(1, "blob", "bn1.running_var")]
    with pytest.raises(IntegrityError, match=r"cnn@1: tensor 'bn1.running_var'"):
        reg.tensors("cnn@1")
    with pytest.raises(IntegrityError, match=r"cnn@1: tensor 'bn1.running_var'"):
        reg.export("cnn@1", "onnx", tmp_path / "local-export")
    assert not (tmp_path / "local-export").exists() or not any((tmp_path / "local-export").iterdir())
    with pytest.raises(IntegrityError, match=r"cnn@1: tensor 'bn1.running_var'"):
        reg.pull("cnn@1", tmp_path / "local-pull.safetensors", "safetensors")  # an nn.Module: its state dict
    assert not (tmp_path / "local-pull.safetensors").exists()

    token = create_token(db, "dashboard", "read")
    with running_server(db=db, blobs=blobs, log=tmp_path / "serve.log") as server:
        http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        verified = http.post("/api/v1/verify", params={"check": "false"}).json()
        assert verified["passed"] is False and [(p["kind"], p["tensor"]) for p in verified["problems"]] == [
            ("blob", "bn1.running_var")
        ]
        model = http.get("/api/v1/models/cnn/versions/1/model", params={"format": "safetensors"})
        assert model.status_code == 500 and model.json()["error"]["code"] == "integrity_error", model.text
        assert "bn1.running_var" in model.json()["error"]["message"]
        blob = http.get(f"/api/v1/blobs/{digest}")
        assert blob.status_code == 500 and blob.json()["error"]["code"] == "integrity_error", blob.text
        assert digest in blob.json()["error"]["message"] and bytes(tampered) not in blob.content
        with pytest.raises(
            httpx.RemoteProtocolError
        ):  # the body ends short of its Content-Length: no client takes it as whole
            with http.stream("GET", "/api/v1/models/cnn/versions/1/bundle") as response:
                assert response.status_code == 200
                b"".join(response.iter_bytes())
        http.close()
        with RemoteRegistry(server.url, token) as remote:
            with pytest.raises(IntegrityError, match=r"stopped by the server: version cnn@1: tensor 'bn1.running_var'"):
                remote.tensors("cnn@1")
            with pytest.raises(IntegrityError, match=r"tensor 'bn1.running_var'"):
                remote.export("cnn@1", "onnx", tmp_path / "remote-export")
            with pytest.raises(IntegrityError, match=r"tensor 'bn1.running_var'"):
                remote.pull("cnn@1", tmp_path / "remote-pull.safetensors", "safetensors")
        assert not (tmp_path / "remote-export").exists() and not (tmp_path / "remote-pull.safetensors").exists()
    assert "bn1.running_var" in server.log_text()
    reg.meta.close()


def test_a_streamed_large_blob_goes_up_in_parts_and_appears_only_if_it_hashes_to_its_digest(s3_env):
    _, bucket, client = s3_env
    store = S3BlobStore.from_uri(f"s3://{bucket}/stream", multipart_threshold=5 * MiB, part_size=5 * MiB)
    data = os.urandom(12 * MiB)
    digest = hashlib.sha256(data).hexdigest()

    def chunks():
        return (data[start : start + 3 * MiB] for start in range(0, len(data), 3 * MiB))

    with pytest.raises(IntegrityError, match="changed"):
        store.stage_stream(chunks(), hashlib.sha256(b"what was hashed before").hexdigest(), len(data))
    assert "Contents" not in client.list_objects_v2(Bucket=bucket)  # no object under either digest
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")  # the upload was aborted
    staged = store.stage_stream(chunks(), digest, len(data))
    assert store.publish(staged) == digest and store.get(digest) == data
    assert (
        client.head_object(Bucket=bucket, Key=store.key_of(digest))["ETag"].strip('"').endswith("-3")
    )  # 5 + 5 + 2 MiB
    small = b"running statistics"
    assert (
        store.publish(store.stage_stream(iter([small[:7], small[7:]]), hashlib.sha256(small).hexdigest(), len(small)))
        == hashlib.sha256(small).hexdigest()
    )
