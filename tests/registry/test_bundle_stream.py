"""Registering a bundle while it streams in (Registry.register_stream, the HTTP upload path).

Real models (a trained torch CNN), real tar streams read in odd-sized pieces, a real local blob
folder and a real S3 API (moto server). What was stored is read back through the registry and
compared with registering the same artifact folder directly, and every refusal is checked to
leave the versions, the blobs and the staging area as they were.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import struct
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from registry.tensor_blobs import check_tensor_header, tensor_blob
from registry.artifact import extract_artifact
from registry.manifest_io import save_artifact_folder
from registry.bundle_stream import UploadInterrupted, gated_digests
from registry.client_transfer import folder_tar_chunks
from registry.service import Registry
from schemas.errors import CheckFailedError, InputFileError, PayloadTooLargeError
from schemas.manifest import TensorRef, load_manifest
from tests import moto_server
from tests.registry.test_registry_service import trained_cnn

moto_s3 = moto_server.moto_s3
s3_env = moto_server.s3_env

NO_LIMIT = 1 << 40


class Trickle:
    """A stream that returns at most `piece` bytes per read (as a socket does),
    optionally pausing once at `pause_at`."""

    def __init__(
        self,
        data: bytes,
        piece: int = 7_919,
        pause_at: int | None = None,
        until: threading.Event | None = None,
        fail_at: int | None = None,
    ):
        self.data, self.piece, self.position = data, piece, 0
        self.pause_at, self.until, self.fail_at = pause_at, until, fail_at
        self.waited: bool | None = None

    def read(self, size: int = -1) -> bytes:
        if self.pause_at is not None and self.position >= self.pause_at and self.waited is None:
            self.waited = self.until.wait(timeout=30)
        if self.fail_at is not None and self.position >= self.fail_at:
            raise UploadInterrupted("the client disconnected (test)")
        end = self.position + min(self.piece, size if size >= 0 else self.piece)
        if self.pause_at is not None and self.waited is None:
            end = min(end, self.pause_at)
        chunk, self.position = self.data[self.position : end], min(end, len(self.data))
        return chunk


@pytest.fixture
def local(tmp_path) -> Registry:
    registry = Registry(db=f"sqlite:///{tmp_path / 'registry.db'}", blobs=str(tmp_path / "blobs"), user="uploader")
    yield registry
    registry.meta.close()


@pytest.fixture(scope="module")
def artifact_folder(tmp_path_factory) -> Path:
    return save_artifact_folder(extract_artifact(trained_cnn(seed=3)), tmp_path_factory.mktemp("bundle") / "artifact")


def client_tar(folder: Path) -> bytes:
    """The bundle exactly as `normbridge --server URL register FOLDER` sends it."""
    return b"".join(folder_tar_chunks(folder, lambda done: None))


def tar_of(members: list[tuple[str, bytes]], mode: str = "w", fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode, format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def members_of(folder: Path) -> list[tuple[str, bytes]]:
    """manifest.json and every blob of an artifact folder, manifest LAST (as `tar` of a sorted folder lists them)."""
    blobs = sorted((f"blobs/{p.name}", p.read_bytes()) for p in (folder / "blobs").iterdir())
    return blobs + [("manifest.json", (folder / "manifest.json").read_bytes())]


def state(registry: Registry) -> dict:
    """What a refused registration must not change: versions, blobs, hidden staging files."""
    root = Path(registry.store.root) if hasattr(registry.store, "root") else None
    return {
        "versions": [
            (r.model, r.number, r.digest) for name, _, _ in registry.models() for r in registry.versions(name)
        ],
        "blobs": sorted(registry.store.digests()),
        "staging": sorted(str(p) for p in root.rglob(".*.tmp")) if root else [],
    }


def test_a_streamed_bundle_registers_the_same_content_as_the_folder(local, artifact_folder, tmp_path):
    streamed = local.register_stream("cnn", Trickle(client_tar(artifact_folder)), NO_LIMIT)
    assert streamed.created and streamed.version.number == 1 and streamed.version.operation == "imported"
    direct = Registry(
        db=f"sqlite:///{tmp_path / 'direct.db'}", blobs=str(tmp_path / "direct-blobs"), user="u"
    ).register("cnn", artifact_folder)
    assert streamed.version.content_digest == direct.version.content_digest
    assert [c.passed for c in streamed.checks] == [True, True]
    # what was stored reads back byte-identical and re-validates
    stored = local.tensors("cnn@1")
    for name, ref in json.loads((artifact_folder / "manifest.json").read_text())["tensors"].items():
        data = (artifact_folder / "blobs" / f"{ref['digest']}.safetensors").read_bytes()
        assert hashlib.sha256(data).hexdigest() == ref["digest"]
        assert stored[name].tobytes() == (data[len(data) - ref["nbytes"] :])  # the raw data ends the safetensors blob
    assert local.verify().passed
    assert state(local)["staging"] == []
    # the same bytes again, manifest last and gzip-compressed: the existing version
    again = local.register_stream("cnn", io.BytesIO(gzip.compress(tar_of(members_of(artifact_folder)))), NO_LIMIT)
    assert not again.created and again.version.number == 1


def test_the_gate_starts_before_the_bulk_weights_have_arrived(local, artifact_folder):
    """The client sends the manifest and the normalizers' blobs first; the stream stalls right after them until
    the gate has started, so this registration completes only if the gate did not wait for the whole bundle."""
    gated = gated_digests(load_manifest(json.loads((artifact_folder / "manifest.json").read_text())))
    data = client_tar(artifact_folder)
    names = [m.name for m in tarfile.open(fileobj=io.BytesIO(data))]
    digests = [n.removeprefix("blobs/").removesuffix(".safetensors") for n in names[1:]]
    assert (
        names[0] == "manifest.json"
        and set(digests[: len(gated)]) == gated
        and set(digests[len(gated) :]).isdisjoint(gated)
    )
    # the byte offset where the first bulk blob's header starts
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        first_bulk = [m for m in tar.getmembers()][1 + len(gated)].offset
    started = threading.Event()

    def progress(step: str, done: int, total: int) -> None:
        if step.startswith("checking"):
            started.set()

    stream = Trickle(data, pause_at=first_bulk, until=started)
    result = local.register_stream("cnn", stream, NO_LIMIT, progress=progress)
    assert result.created and stream.waited is True, "the gate did not start until the bulk weights had arrived"


def corrupted(folder: Path, tmp_path: Path, how: str) -> bytes:
    """A bundle of `folder` with one defect (each refused with a message naming the file or tensor)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    weight = next(
        name for name, ref in manifest["tensors"].items() if ref["role"] == "weight" and len(ref["shape"]) == 4
    )
    digest = manifest["tensors"][weight]["digest"]
    members = [(n, d) for n, d in members_of(folder)]
    if how == "bytes changed":
        members = [(n, d[:-4] + b"\0\0\0\1" if digest in n else d) for n, d in members]
    elif how == "blob missing":
        members = [(n, d) for n, d in members if digest not in n]
    elif how == "header disagrees":
        shape = manifest["tensors"][weight]["shape"]
        manifest["tensors"][weight]["shape"] = [shape[1], shape[0], *shape[2:]]
        members = [(n, json.dumps(manifest).encode() if n == "manifest.json" else d) for n, d in members]
    elif how == "two manifests":
        members = members + [("manifest.json", (folder / "manifest.json").read_bytes())]
    elif how == "two folders":
        members = [(("a/" if n.startswith("blobs") else "b/") + n, d) for n, d in members]
    elif how == "no manifest":
        members = [(n, d) for n, d in members if n != "manifest.json"]
    elif how == "manifest not JSON":
        members = [(n, b"{not json" if n == "manifest.json" else d) for n, d in members]
    return tar_of(members)


@pytest.mark.parametrize(
    "how, message",
    [
        ("bytes changed", r"does not hash to its name"),
        ("blob missing", r"the blob of tensor '(conv1|conv2)\.weight' .* is missing from the bundle"),
        (
            "header disagrees",
            r"the blob of tensor '(conv1|conv2)\.weight' holds float32\[.*\] but the manifest says float32",
        ),
        ("two manifests", r"holds manifest.json twice"),
        ("two folders", r"artifact files in both 'a' and 'b'"),
        ("no manifest", r"holds no manifest.json"),
        ("manifest not JSON", r"is not valid JSON"),
    ],
)
def test_a_defective_bundle_is_refused_and_leaves_nothing(local, artifact_folder, tmp_path, how, message):
    before = state(local)
    with pytest.raises(InputFileError, match=message):
        local.register_stream("cnn", Trickle(corrupted(artifact_folder, tmp_path, how)), NO_LIMIT)
    assert state(local) == before
    assert [e.detail["error"] for e in local.audit(model="cnn")] == ["bad_input_file"]


def test_extra_files_and_one_enclosing_folder_are_accepted(local, artifact_folder):
    members = [("artifact/" + n, d) for n, d in members_of(artifact_folder)] + [("artifact/README.txt", b"notes")]
    result = local.register_stream("cnn", io.BytesIO(tar_of(members)), NO_LIMIT)
    assert result.created and local.verify().passed and state(local)["staging"] == []


def test_the_tar_the_docs_and_errors_recommend_registers(local, artifact_folder, tmp_path):
    """`tar -cf - -C FOLDER .` (GNU tar) starts with the member './', which was refused as an unsafe path."""
    import subprocess

    data = subprocess.run(["tar", "-cf", "-", "-C", str(artifact_folder), "."], check=True, capture_output=True).stdout
    assert tarfile.open(fileobj=io.BytesIO(data)).getnames()[0] in ("./", ".")
    assert local.register_stream("cnn", io.BytesIO(data), NO_LIMIT).created
    for unsafe in ("/", "../", "./../x"):
        with pytest.raises(InputFileError, match="unsafe path"):
            local.register_stream("cnn2", io.BytesIO(tar_of([(unsafe + "manifest.json", b"{}")])), NO_LIMIT)


def test_over_the_limit_an_interrupted_upload_and_a_failing_gate_leave_nothing(local, artifact_folder):
    from tests.registry.http.test_http_api import failing_gate_bundle

    before = state(local)
    data = client_tar(artifact_folder)
    with pytest.raises(PayloadTooLargeError, match="larger than this server's limit of 4096 bytes"):
        local.register_stream("cnn", Trickle(data), 4096)
    with pytest.raises(UploadInterrupted):
        local.register_stream("cnn", Trickle(data, fail_at=len(data) // 2), NO_LIMIT)
    with pytest.raises(CheckFailedError, match="failed the round-trip equivalence check"):
        local.register_stream("cnn", io.BytesIO(failing_gate_bundle(artifact_folder.parent)), NO_LIMIT)
    assert state(local) == before
    # an upload that never arrived whole (too large, interrupted) is not a registration attempt:
    # only the gate's refusal is audited
    assert [e.detail["error"] for e in local.audit(model="cnn")] == ["check_failed"]


def test_headers_count_toward_the_limit_and_long_names_and_pax_headers_are_capped(local, artifact_folder):
    """Attack (issue 11 item 3): sizes only counted the members that came out, and tarfile read long names whole."""
    base = members_of(artifact_folder)
    limit = len(tar_of(base)) + (512 << 10)
    assert local.register_stream("cnn", io.BytesIO(tar_of(base + [("junk/a", b"")])), limit).created
    before = state(local)
    headers_only = tar_of(base + [(f"junk/{i}", b"") for i in range(2048)])  # 1 MiB of headers, no data
    with pytest.raises(
        PayloadTooLargeError,
        match=f"decompressed and counting its headers, is larger than this server's limit of {limit}",
    ):
        local.register_stream("cnn", io.BytesIO(headers_only), limit)
    with pytest.raises(InputFileError, match=r"is a GNU long name of 5007 bytes; at most 4096"):
        local.register_stream(
            "cnn", io.BytesIO(tar_of(base + [("junk/" + "n" * 5001, b"x")], fmt=tarfile.GNU_FORMAT)), limit
        )
    with pytest.raises(InputFileError, match=r"is a pax header of \d+ bytes; at most 65536"):
        local.register_stream("cnn", io.BytesIO(tar_of(base + [("junk/" + "n" * 70_000, b"x")])), limit)
    assert state(local) == before


@pytest.mark.slow
def test_on_s3_blobs_are_written_during_the_gate_and_a_refused_bundle_leaves_only_unreferenced_blobs(
    s3_env, artifact_folder, tmp_path
):
    from tests.registry.http.test_http_api import failing_gate_bundle

    _, bucket, client = s3_env
    registry = Registry(db=f"sqlite:///{tmp_path / 'registry.db'}", blobs=f"s3://{bucket}/blobs", user="uploader")
    result = registry.register_stream("cnn", Trickle(client_tar(artifact_folder), piece=65_536), NO_LIMIT)
    assert result.created and registry.verify().passed
    referenced = set(registry.store.digests())
    assert referenced == {ref.digest for ref in registry.manifest("cnn@1").tensors.values()}
    head = client.head_object(Bucket=bucket, Key=registry.store.key_of(sorted(referenced)[0]))
    assert head["Metadata"] == {"sha256": sorted(referenced)[0]}

    with pytest.raises(CheckFailedError):
        registry.register_stream("cnn", io.BytesIO(failing_gate_bundle(tmp_path)), NO_LIMIT)
    assert [(r.model, r.number) for r in registry.versions("cnn")] == [("cnn", 1)]
    orphans = set(registry.store.digests()) - referenced
    assert orphans, "S3 staging writes the (already hashed) blobs while the gate runs"
    assert all(registry.store.get(d) for d in orphans)  # each under its true digest, never a wrong key
    assert registry.gc(grace_seconds=3600).deleted == []  # young: a registration may still be about to reference them
    assert set(registry.gc(grace_seconds=0).deleted) == orphans
    assert set(registry.store.digests()) == referenced and registry.verify().passed
    registry.meta.close()


def test_tensor_headers_are_checked_against_an_independently_written_header():
    """check_tensor_header reads what safetensors writes, and refuses headers built by hand to disagree."""

    def blob(header: dict, payload: bytes) -> bytes:
        text = json.dumps(header).encode()
        return struct.pack("<Q", len(text)) + text + payload

    ref = TensorRef(digest="0" * 64, dtype="float32", shape=[2, 3], nbytes=24, role="weight")
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    check_tensor_header(tensor_blob(array), ref, "w")
    check_tensor_header(
        blob({"tensor": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, array.tobytes()), ref, "w"
    )
    check_tensor_header(
        tensor_blob(np.array(5, dtype=np.int64)),
        TensorRef(digest="0" * 64, dtype="int64", shape=[], nbytes=8, role="weight"),
        "n",
    )
    refused = {
        "dtype": blob({"tensor": {"dtype": "F64", "shape": [2, 3], "data_offsets": [0, 48]}}, bytes(48)),
        "shape": blob({"tensor": {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 24]}}, bytes(24)),
        "truncated": blob({"tensor": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, bytes(20)),
        "trailing": blob({"tensor": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, bytes(28)),
        "two tensors": blob(
            {
                "tensor": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                "other": {"dtype": "F32", "shape": [1], "data_offsets": [24, 28]},
            },
            bytes(28),
        ),
        "header past the end": struct.pack("<Q", 10_000) + b"{}",
        "not JSON": struct.pack("<Q", 3) + b"abc",
        "empty": b"",
    }
    for label, data in refused.items():
        with pytest.raises(InputFileError, match="tensor 'w'"):
            check_tensor_header(data, ref, "w")
            pytest.fail(f"{label} was accepted")


def test_the_client_sends_normalizer_blobs_right_after_the_manifest(artifact_folder, tmp_path):
    copy = shutil.copytree(artifact_folder, tmp_path / "copy")
    (copy / "manifest.json").write_text("{broken")  # unreadable manifest: still sent, in plain sorted order
    names = [m.name for m in tarfile.open(fileobj=io.BytesIO(client_tar(copy)))]
    assert names[0] == "manifest.json" and names[1:] == sorted(names[1:])


def test_staging_waits_while_the_window_of_queued_bytes_is_full():
    """The reader (and so the uploading client) is held back while more than the window's bytes wait for the store."""
    from concurrent.futures import ThreadPoolExecutor

    from registry.bundle_stream import _Window

    release = threading.Event()
    window = _Window(budget=100)
    submitted: list[int] = []
    with ThreadPoolExecutor(max_workers=4) as pool:

        def submit_three() -> None:
            for size in (60, 40, 30):  # 60 + 40 fill the window; 30 must wait for one of them
                window.submit(pool, lambda data: release.wait(timeout=30), b"x" * size)
                submitted.append(size)

        reader = threading.Thread(target=submit_three)
        reader.start()
        reader.join(timeout=1.0)
        assert submitted == [60, 40] and reader.is_alive()
        release.set()
        reader.join(timeout=30)
        assert submitted == [60, 40, 30]
    big = _Window(budget=10)  # a blob larger than the whole window still goes through, alone
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert big.submit(pool, len, b"y" * 50).result(timeout=30) == 50


def test_a_bundle_may_leave_out_blobs_the_store_holds_when_reuse_allows_them(local, artifact_folder, tmp_path):
    from registry.manifest_io import load_artifact_folder
    from schemas.errors import NotFoundError
    from tests.registry.test_registry_service import finetune_statistics

    local.register("cnn", artifact_folder)
    held = set(local.store.digests())
    finetuned = save_artifact_folder(
        extract_artifact(finetune_statistics(trained_cnn(seed=3), seed=9)), tmp_path / "finetuned"
    )
    artifact = load_artifact_folder(finetuned)
    new = [d for d in artifact.manifest.blob_digests() if d not in held]
    assert new and set(artifact.blobs) - set(new)  # only the statistics changed
    slim = tar_of(
        [(f"blobs/{d}.safetensors", artifact.blobs[d]) for d in new]
        + [("manifest.json", (finetuned / "manifest.json").read_bytes())]
    )

    def allowed(
        digests: set[str],
    ) -> set[str]:  # the policy the HTTP layer applies: blobs a readable version references
        return digests & local.meta.referenced_digests()

    before = state(local)
    with pytest.raises(InputFileError, match="is missing from the bundle; export"):
        local.register_stream("cnn", io.BytesIO(slim), NO_LIMIT)  # no reuse: every blob must be sent
    with pytest.raises(NotFoundError):  # a policy that allows a blob the store does not hold registers nothing
        local.register_stream(
            "cnn",
            io.BytesIO(tar_of([("manifest.json", (finetuned / "manifest.json").read_bytes())])),
            NO_LIMIT,
            reuse=lambda digests: digests,
        )
    lying = json.loads((finetuned / "manifest.json").read_text())
    weight = next(n for n, ref in lying["tensors"].items() if ref["digest"] in held and len(ref["shape"]) == 4)
    lying["tensors"][weight]["shape"] = lying["tensors"][weight]["shape"][::-1]
    with pytest.raises(
        InputFileError, match=f"the blob of tensor '{weight}' holds float32"
    ):  # checked from the stored header
        local.register_stream(
            "cnn", io.BytesIO(tar_of([("manifest.json", json.dumps(lying).encode())])), NO_LIMIT, reuse=allowed
        )
    assert state(local) == before

    result = local.register_stream("cnn", io.BytesIO(slim), NO_LIMIT, reuse=allowed)
    assert result.created and result.version.number == 2
    assert result.version.content_digest == artifact.manifest.content_digest()
    assert local.verify().passed and state(local)["staging"] == []
    assert set(local.store.digests()) == held | set(new)
