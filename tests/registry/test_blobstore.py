"""The local blob store: content addressing, sharding, atomic read-only writes, tamper detection."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

import pytest

from registry.blobs import open_blob_store
from registry.blobs.filesystem_sync import MIN_PATHS, sync_filesystem
from registry.blobs.local import LocalBlobStore
from schemas.errors import IntegrityError, NotFoundError, RegistryError, StorageFullError


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
    with pytest.raises(
        StorageFullError, match=f"the blob store '{store.root}' has no room left .*injected"
    ):  # a full disk, typed
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


def test_blobs_staged_unsynced_are_synced_together_then_published_at_once(tmp_path):
    """What a registration does (registration._stage, _publish): stage with sync=False, one sync, one publish_all."""
    store = LocalBlobStore(tmp_path)
    blobs = [f"tensor {i}".encode() * (i + 1) for i in range(20)]
    staged = [store.stage(data, sync=False) for data in blobs[:10]]
    staged += [
        store.stage_stream(iter([data[:3], data[3:]]), hashlib.sha256(data).hexdigest(), len(data), sync=False)
        for data in blobs[10:]
    ]
    assert not any(blob.synced for blob in staged) and all(
        blob.temporary.read_bytes() == data for blob, data in zip(staged, blobs)
    )
    assert list(store.digests()) == []  # staged is not stored
    store.sync(staged)
    assert all(blob.synced for blob in staged)
    seen = []
    store.publish_all(staged, seen.append)
    assert seen == list(range(20))
    assert sorted(store.digests()) == sorted(hashlib.sha256(data).hexdigest() for data in blobs)
    assert all(store.get(hashlib.sha256(data).hexdigest()) == data for data in blobs)
    assert not list(tmp_path.rglob(".*.tmp"))


def test_a_blob_published_unsynced_is_synced_first_and_a_failed_rename_leaves_no_temporary(tmp_path, monkeypatch):
    store = LocalBlobStore(tmp_path)
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda handle: synced.append(handle) or real_fsync(handle))
    lone = store.stage(b"one blob", sync=False)
    assert (
        store.publish(lone) == hashlib.sha256(b"one blob").hexdigest() and lone.synced and synced
    )  # its file, then its folder
    staged = [store.stage(f"blob {i}".encode(), sync=False) for i in range(4)]
    renamed = []
    real_replace = os.replace

    def replace_then_fail(source, target):
        if len(renamed) == 2:
            raise OSError(28, "No space left on device (injected)")
        renamed.append(target)
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace_then_fail)
    with pytest.raises(StorageFullError, match="injected"):
        store.publish_all(staged)
    monkeypatch.undo()
    assert not list(tmp_path.rglob(".*.tmp"))  # the two left unpublished were discarded, not left half way
    assert sorted(store.digests()) == sorted([lone.digest, *(blob.digest for blob in staged[:2])])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="syncfs is Linux's")
def test_many_staged_blobs_are_made_durable_by_one_syncfs_of_their_filesystem_not_an_fsync_each(tmp_path, monkeypatch):
    """registry/blobs/filesystem_sync.py: 20 new files in up to 20 shard folders cost two syncfs calls, no fsync; fewer
    than MIN_PATHS are fsynced one by one, and a folder on another filesystem is never covered by the root's syncfs."""
    store = LocalBlobStore(tmp_path)
    fsynced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda handle: fsynced.append(handle) or real_fsync(handle))
    staged = [store.stage(f"many {i}".encode(), sync=False) for i in range(20)]
    store.publish_all(staged)
    assert fsynced == [] and all(blob.synced for blob in staged)
    assert all(store.get(blob.digest) for blob in staged) and not list(tmp_path.rglob(".*.tmp"))
    few = [store.stage(f"few {i}".encode(), sync=False) for i in range(MIN_PATHS - 1)]
    store.sync(few)
    assert len(fsynced) == MIN_PATHS - 1
    assert sync_filesystem(tmp_path, [tmp_path]) is True
    other = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/proc")
    assert os.stat(other).st_dev != os.stat(tmp_path).st_dev
    assert sync_filesystem(tmp_path, [tmp_path, other]) is False


def test_stage_chunks_hashes_as_it_writes_and_stages_the_blob_where_stage_would(tmp_path):
    """What early staging does (registry/early_staging.py): the digest is learnt from the bytes written, not given."""
    store = LocalBlobStore(tmp_path)
    data = bytes(range(256)) * 1000
    staged = store.stage_chunks(iter([data[:1000], data[1000:5000], data[5000:]]), sync=False)
    digest = hashlib.sha256(data).hexdigest()
    assert staged.digest == digest and not staged.synced
    assert staged.temporary.parent == tmp_path / digest[:2] and staged.temporary.name.startswith(f".{digest[2:10]}.")
    assert staged.temporary.read_bytes() == data
    assert list(store.digests()) == [] and not list(tmp_path.glob(".*"))  # staged, not stored; nothing left pending
    store.publish_all([staged])
    assert store.get(digest) == data and not list(tmp_path.rglob(".*.tmp"))

    again = store.stage_chunks(iter([data]))  # a blob the store holds: nothing staged
    assert again.digest == digest and again.temporary is None and not list(tmp_path.rglob(".*.tmp"))


def test_stage_chunks_that_fail_midway_leave_no_file(tmp_path):
    store = LocalBlobStore(tmp_path)

    def chunks():
        yield b"first half"
        raise InterruptedError("the source went away")

    with pytest.raises(InterruptedError):
        store.stage_chunks(chunks())
    assert [path for path in tmp_path.rglob("*") if path.is_file()] == []


def test_gc_removes_a_crashed_writers_pending_file_after_the_grace_period(tmp_path):
    """A process killed inside stage_chunks leaves '.pending.*.tmp' at the store's root;
    gc's sweep removes it once old."""
    store = LocalBlobStore(tmp_path)
    old, young = tmp_path / ".pending.aaaa.tmp", tmp_path / ".pending.bbbb.tmp"
    old.write_bytes(b"half")
    young.write_bytes(b"half")
    os.utime(old, (0, 0))
    assert store.remove_stale_staging(3600) == 1
    assert not old.exists() and young.exists()
