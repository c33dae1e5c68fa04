"""Decompression bombs sent to a real `normbridge serve --max-upload-mb 8`: refused,
with the server's peak memory bounded.

A bundle upload may be gzip, so a small body can hold gigabytes of tar. The bombs are built by
streaming zeros through zlib (the test never holds them decompressed): a GNU long-name header, a
pax header and plain members, each declaring hundreds of MiB of zeros. `.pt2` and `.keras`
uploads are zip archives, whose entries may be deflated: a genuine `.pt2` whose sample inputs or
one weight entry is 1 GiB of deflated zeros, and a `.keras` whose config.json unpacks to 256 MiB
at a ratio under the 100x that Keras itself refuses. A `.keras` can also declare more than it stores inside
its entries (issue 30, holes 4 and 5, tests/keras_crafting.py): an HDF5 weight never written, one that gzip
packs 60x, weights in an `.npz` of deflated zeros, a config.json building an 8000x8000 Dense (before the fix
+1 GiB, +250 MiB, +1.3 GiB and +0.95 GiB). The server's peak resident
memory is read from /proc/<pid>/status (VmHWM, reset first through /proc/<pid>/clear_refs), so
the bound is measured on the process that received the upload, not inferred.
"""

from __future__ import annotations

import io
import os
import random
import re
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.http_server import create_token, running_server
from tests.keras_crafting import craft, genuine_keras, giant_dense, noisy_kernel, npz_weights, unwritten_kernel

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

LIMIT_MB = 8
PEAK_BOUND = 100 << 20  # bytes the upload may add to the server's resident memory
ZERO_CHUNK = bytes(1 << 20)


def header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    """One 512-byte tar header written by the standard library (not by the reader under test)."""
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode = size, kind, 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def gzip_of(pieces: Iterator[bytes]) -> bytes:
    """A gzip stream of `pieces`, compressed as they come, so the decompressed bytes never exist whole here."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [compressor.compress(piece) for piece in pieces]
    return b"".join(out) + compressor.flush()


def zeros(count: int) -> Iterator[bytes]:
    for start in range(0, count, len(ZERO_CHUNK)):
        yield ZERO_CHUNK[: min(len(ZERO_CHUNK), count - start)]


def long_name_bomb(mib: int) -> bytes:
    """The attack of issue 11 item 3: a GNU long-name header declaring `mib` MiB of name, all zeros."""
    return gzip_of(iter([header("././@LongLink", mib << 20, tarfile.GNUTYPE_LONGNAME), *zeros(mib << 20)]))


def pax_bomb(mib: int) -> bytes:
    """A pax extended header declaring `mib` MiB of records, all zeros."""
    return gzip_of(iter([header("PaxHeaders/x", mib << 20, tarfile.XHDTYPE), *zeros(mib << 20)]))


def members_bomb(mib: int) -> bytes:
    """Plain members of 1 MiB of zeros each, `mib` of them: each one is under the limit, their sum is far over it."""

    def pieces() -> Iterator[bytes]:
        for i in range(mib):
            yield header(f"junk/{i}.bin", 1 << 20)
            yield ZERO_CHUNK

    return gzip_of(pieces())


def zip_bomb(base: bytes, name: str, pieces: Iterator[bytes]) -> bytes:
    """The zip archive `base` (b"" for none) with the entry `name` replaced by `pieces`, deflated as they come
    (what an attacker does with zipfile)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        if base:
            with zipfile.ZipFile(io.BytesIO(base)) as source:
                for info in source.infolist():
                    if info.filename != name:
                        target.writestr(info, source.read(info))
        entry = zipfile.ZipInfo(name)
        entry.compress_type = zipfile.ZIP_DEFLATED
        with target.open(entry, "w", force_zip64=True) as bomb:
            for piece in pieces:
                bomb.write(piece)
    return out.getvalue()


def genuine_pt2_bytes() -> bytes:
    from tests.pt2_crafting import genuine_pt2

    folder = Path(os.environ.get("TMPDIR", "/tmp"))
    path = genuine_pt2(folder / f"bomb-base-{os.getpid()}.pt2")
    try:
        return path.read_bytes()
    finally:
        path.unlink()


def pt2_bomb(entry: str, mib: int) -> bytes:
    """A genuine `.pt2` whose `entry` (below its root folder) holds `mib` MiB of zeros, deflated."""
    base = genuine_pt2_bytes()
    with zipfile.ZipFile(io.BytesIO(base)) as archive:
        root = archive.namelist()[0].split("/")[0]
    return zip_bomb(base, f"{root}/{entry}", zeros(mib << 20))


def keras_bomb(mib: int) -> bytes:
    """A `.keras` archive whose config.json unpacks to `mib` MiB at about 60x: each 4 KiB holds 64 random bytes,
    under Keras's own 100x check."""
    noise = random.Random(0)
    block = 4096

    def pieces() -> Iterator[bytes]:
        for _ in range((mib << 20) // (256 * block)):
            yield b"".join(noise.randbytes(64) + bytes(block - 64) for _ in range(256))

    return zip_bomb(b"", "config.json", pieces())


def genuine_keras_bytes() -> bytes:
    folder = Path(os.environ.get("TMPDIR", "/tmp"))
    path = genuine_keras(folder / f"bomb-base-{os.getpid()}.keras")
    try:
        return path.read_bytes()
    finally:
        path.unlink()


def crafted_keras(**edits) -> bytes:
    """A genuine `.keras` rewritten by tests/keras_crafting.py (holes 4 and 5 of issue 30)."""
    folder = Path(os.environ.get("TMPDIR", "/tmp"))
    genuine, crafted = folder / f"bomb-base-{os.getpid()}.keras", folder / f"bomb-crafted-{os.getpid()}.keras"
    genuine.write_bytes(genuine_keras_bytes())
    try:
        return craft(genuine, crafted, **edits).read_bytes()
    finally:
        genuine.unlink()
        crafted.unlink(missing_ok=True)


def memory(pid: int, field: str) -> int:
    """A /proc/<pid>/status memory field (VmRSS, VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/{pid}/status has no {field}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("bomb")
    db, blobs = f"sqlite:///{root / 'registry.db'}", str(root / "blobs")
    token = create_token(db, "attacker", "write")
    with running_server(db=db, blobs=blobs, args=["--max-upload-mb", str(LIMIT_MB)], log=root / "serve.log") as running:
        with httpx.Client(base_url=running.url, headers={"Authorization": f"Bearer {token}"}, timeout=300) as client:
            # warm up: the bundle path's modules are imported before anything is measured
            warm = client.post(
                "/api/v1/models/warm/versions", params={"format": "bundle"}, content=header("x", 0) + bytes(1024)
            )
            assert warm.status_code == 400, warm.text
            warm = client.post(
                "/api/v1/models/warm-pt2/versions", params={"format": "pt2"}, content=genuine_pt2_bytes()
            )
            assert warm.status_code == 201, warm.text  # torch, onnx and the gate are loaded
            warm = client.post(
                "/api/v1/models/warm-keras/versions", params={"format": "keras"}, content=genuine_keras_bytes()
            )
            assert warm.status_code == 201, (
                warm.text
            )  # keras is loaded, and a config built without allocating (keras_file_checks)
            yield running, client


@pytest.mark.parametrize(
    "label, bomb, status, code, message",
    [
        (
            "long name 0.5 MiB",
            lambda: long_name_bomb(512),
            400,
            "bad_input_file",
            r"GNU long name of 536870912 bytes.*at most 4096",
        ),
        (
            "long name 1 MiB",
            lambda: long_name_bomb(1024),
            400,
            "bad_input_file",
            r"GNU long name of 1073741824 bytes.*at most 4096",
        ),
        ("pax header", lambda: pax_bomb(512), 400, "bad_input_file", r"pax header of 536870912 bytes.*at most 65536"),
        (
            "members",
            lambda: members_bomb(512),
            413,
            "payload_too_large",
            r"decompressed.*larger than this server's limit of 8388608 bytes",
        ),
    ],
)
def test_a_gzip_bomb_is_refused_and_the_servers_peak_memory_stays_bounded(server, label, bomb, status, code, message):
    refused_with_bounded_memory(server, label, "bundle", bomb, status, code, message)


UNPACKED_413 = r"entries unpack to \d+ bytes, more than this server's limit of 8388608 bytes"


@pytest.mark.parametrize(
    "label, file_format, bomb",
    [
        (".pt2 sample inputs 1 GiB", "pt2", lambda: pt2_bomb("data/sample_inputs/model.pt", 1024)),
        (".pt2 weight 1 GiB", "pt2", lambda: pt2_bomb("data/weights/weight_0", 1024)),
        (".keras config.json 256 MiB at 60x", "keras", lambda: keras_bomb(256)),
    ],
)
def test_a_zip_bomb_uploaded_as_a_model_file_is_refused_before_it_is_read(server, label, file_format, bomb):
    refused_with_bounded_memory(server, label, file_format, bomb, 413, "payload_too_large", UNPACKED_413)


@pytest.mark.parametrize(
    "label, bomb, status, code, message",
    [
        (
            ".keras weights dataset of 256 MiB never written",
            lambda: crafted_keras(edit_weights=unwritten_kernel(8192)),
            400,
            "bad_input_file",
            r"the uploaded .keras file entry 'model.weights.h5' dataset 'layers/dense/vars/0' declares .* and stores none",
        ),
        (
            ".keras weights of 64 MiB at 60x",
            lambda: crafted_keras(edit_weights=noisy_kernel(64)),
            413,
            "payload_too_large",
            r"'model.weights.h5' declares 67\d+ bytes of weights, more than this server's limit of 8388608 bytes",
        ),
        (
            ".keras weights in a 64 MiB npz",
            lambda: crafted_keras(replace_weights=npz_weights(16 << 20)),
            400,
            "bad_input_file",
            r"holds no 'model.weights.h5' \(a 'model.weights.npz'",
        ),
        (
            ".keras config of an 8000x8000 Dense",
            lambda: crafted_keras(edit_config=giant_dense(8000)),
            400,
            "bad_input_file",
            r"'config.json' builds 6 variables of 256160000 bytes",
        ),
    ],
)
def test_a_keras_file_declaring_more_than_it_stores_is_refused_before_keras_allocates_it(
    server, label, bomb, status, code, message
):
    refused_with_bounded_memory(server, label, "keras", bomb, status, code, message)


def refused_with_bounded_memory(
    server, label: str, file_format: str, bomb, status: int, code: str, message: str
) -> None:
    """Upload `bomb()` as `file_format`: refused with `status`/`code`/`message`,
    the server's peak memory raised by under PEAK_BOUND."""
    running, client = server
    body = bomb()
    assert len(body) <= 5 << 20, (
        f"{label}: the bomb is {len(body)} bytes, meant to be a few MiB at most (under the 8 MiB limit)"
    )
    pid = running.process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS now
    before = memory(pid, "VmRSS")
    response = client.post("/api/v1/models/bomb/versions", params={"format": file_format}, content=body)
    peak = memory(pid, "VmHWM")
    assert peak - before < PEAK_BOUND, (
        f"{label}: the upload raised the server's peak memory by {(peak - before) >> 20} MiB"
    )
    assert response.status_code == status, (label, response.status_code, response.text[:500])
    error = response.json()["error"]
    assert error["code"] == code and re.search(message, error["message"]), (label, error)
    assert "bomb" not in client.get("/api/v1/models").text
