"""The local blob store: content addressing, sharding, atomic read-only writes, tamper detection."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest

from registry.blobs import open_blob_store
from registry.blobs.local import LocalBlobStore
from schemas.errors import IntegrityError, NotFoundError, RegistryError


def test_put_returns_the_sha256_and_shards_by_its_first_two_digits(tmp_path):
    store = LocalBlobStore(tmp_path / "blobs")
    data = b"running statistics"
    digest = store.put(data)
    assert digest == hashlib.sha256(data).hexdigest()
    path = tmp_path / "blobs" / digest[:2] / digest[2:]
    assert path.read_bytes() == data
    assert store.get(digest) == data
    assert store.exists(digest) and store.size(digest) == len(data)
    assert 0.0 <= store.age_seconds(digest) < 60.0
    assert list(store.digests()) == [digest]


def test_put_is_idempotent_and_leaves_one_read_only_file(tmp_path):
    store = LocalBlobStore(tmp_path)
    first = store.put(b"x" * 1000)
    second = store.put(b"x" * 1000)
    assert first == second
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files == [tmp_path / first[:2] / first[2:]]
    mode = stat.S_IMODE(files[0].stat().st_mode)
    assert mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) == 0


def test_a_failed_write_leaves_no_temporary_file_and_no_blob(tmp_path, monkeypatch):
    store = LocalBlobStore(tmp_path)

    def failing_replace(source, target):
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="injected"):
        store.put(b"half written")
    monkeypatch.undo()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    assert list(store.digests()) == []


def test_get_refuses_a_tampered_blob(tmp_path):
    store = LocalBlobStore(tmp_path)
    digest = store.put(b"weights")
    path = store.path_of(digest)
    path.chmod(0o644)
    path.write_bytes(b"weightz")
    with pytest.raises(
        IntegrityError, match=f"blob {digest} .* now hashes to {hashlib.sha256(b'weightz').hexdigest()}"
    ):
        store.get(digest)
    assert store.exists(digest)


def test_absent_blobs_and_bad_digests(tmp_path):
    store = LocalBlobStore(tmp_path)
    missing = hashlib.sha256(b"never stored").hexdigest()
    assert not store.exists(missing)
    with pytest.raises(NotFoundError, match=missing):
        store.get(missing)
    with pytest.raises(NotFoundError):
        store.size(missing)
    with pytest.raises(RegistryError, match="64 lowercase hex"):
        store.get("../../etc/passwd")


def test_delete_removes_a_read_only_blob(tmp_path):
    store = LocalBlobStore(tmp_path)
    keep, drop = store.put(b"keep"), store.put(b"drop")
    store.delete(drop)
    store.delete(drop)  # absent: not an error
    assert sorted(store.digests()) == [keep]


def test_open_blob_store_takes_a_path_or_a_file_uri(tmp_path):
    by_path = open_blob_store(str(tmp_path / "a"))
    by_uri = open_blob_store((tmp_path / "a").as_uri())
    digest = by_path.put(b"shared")
    assert isinstance(by_uri, LocalBlobStore) and by_uri.get(digest) == b"shared"
    assert by_uri.uri == by_path.uri == (tmp_path / "a").resolve().as_uri()


def test_an_unknown_scheme_lists_the_registered_schemes():
    with pytest.raises(RegistryError, match="unknown scheme 'gs'; currently registered schemes are file, s3"):
        open_blob_store("gs://bucket/blobs")
