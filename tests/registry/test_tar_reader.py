"""The bounded tar reader against archives written by Python's tarfile and by GNU tar, and against hostile ones.

The oracle for what an archive holds is the standard library's tarfile reading the same file (random
access, not the code under test). Hostile archives are written with tarfile's own header writer and
then bent: a name or pax header over its cap, headers that add up past the limit, a broken checksum,
a truncated member. Memory is measured with tracemalloc while a gzip bomb is refused.
"""

from __future__ import annotations

import gzip
import io
import subprocess
import tarfile
import tracemalloc
import zlib
from pathlib import Path

import pytest

from registry.bundle_stream import too_large
from registry.tar_reader import MAX_LONG_NAME, MAX_PAX_HEADER, read_tar
from schemas.errors import InputFileError, PayloadTooLargeError

NO_LIMIT = 1 << 40
LONG_DIR = "a-first-folder-with-a-name-of-about-fifty-bytes-long/a-second-folder-with-a-name-of-fifty-bytes-too"


def entries(data: bytes, limit: int = NO_LIMIT, piece: int | None = None) -> list[tuple[str, str, bytes]]:
    stream = Pieces(data, piece) if piece else io.BytesIO(data)
    return [(e.name, e.kind, e.read()) for e in read_tar(stream, limit, lambda: too_large(limit, decompressed=True))]


class Pieces(io.RawIOBase):
    """A stream that returns at most `piece` bytes per read, as a socket does."""

    def __init__(self, data: bytes, piece: int):
        self.data, self.piece, self.position = data, piece, 0

    def read(self, size: int = -1) -> bytes:
        end = self.position + min(self.piece, size if size >= 0 else self.piece)
        chunk, self.position = self.data[self.position : end], min(end, len(self.data))
        return chunk


def oracle(archive: Path) -> list[tuple[str, str, bytes]]:
    """What tarfile itself reads from the archive file (names without a trailing slash, as the reader gives them)."""
    found = []
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            kind = (
                "file"
                if member.isreg()
                else "directory"
                if member.isdir()
                else "link"
                if member.issym() or member.islnk()
                else "other"
            )
            found.append((member.name, kind, tar.extractfile(member).read() if member.isreg() else b""))
    return found


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder with a short and a long path, an empty file and a file of 1 MiB + 1 byte (not a multiple of 512)."""
    root = tmp_path_factory.mktemp("tree")
    (root / LONG_DIR / "blobs").mkdir(parents=True)
    (root / "manifest.json").write_bytes(b'{"short": true}')
    (root / LONG_DIR / "blobs" / ("b" * 64 + ".safetensors")).write_bytes(bytes(range(256)) * 4096 + b"!")
    (root / LONG_DIR / "empty").write_bytes(b"")
    (root / "caf\u00e9.txt").write_bytes("non-ASCII name".encode())
    return root


def normalized(found: list[tuple[str, str, bytes]]) -> list[tuple[str, str, bytes]]:
    return [(name.removeprefix("./").rstrip("/"), kind, data) for name, kind, data in found if name not in (".", "./")]


@pytest.mark.parametrize(
    "how",
    [
        "tarfile-ustar-gz",
        "tarfile-gnu",
        "tarfile-pax-bz2",
        "tarfile-pax-xz",
        "tar-gnu",
        "tar-pax-gz",
        "tar-ustar",
        "tar-oldgnu-gz",
    ],
)
def test_archives_written_by_tarfile_and_gnu_tar_read_as_tarfile_reads_them(folder, tmp_path, how):
    tool, layout = how.split("-", 1)
    fmt, _, compression = layout.partition("-")
    archive = tmp_path / "a.tar"
    if tool == "tarfile":
        formats = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
        with tarfile.open(archive, f"w:{compression}" if compression else "w", format=formats[fmt]) as tar:
            tar.add(folder, arcname=".")  # ustar splits a path of up to 255 bytes into prefix and name
    else:
        options = {"gz": ["-z"], "": []}[compression]
        command = [
            "tar",
            f"--format={'posix' if fmt == 'pax' else fmt}",
            *options,
            "-cf",
            str(archive),
            "-C",
            str(folder),
            ".",
        ]
        if fmt == "ustar":
            command[-1:] = ["manifest.json", LONG_DIR]
        subprocess.run(command, check=True, capture_output=True)
    expected = normalized(oracle(archive))
    assert any(len(name) > 100 for name, _, _ in expected) and any(kind == "directory" for _, kind, _ in expected)
    data = archive.read_bytes()
    assert normalized(entries(data)) == expected
    assert normalized(entries(data, piece=777)) == expected  # a body that arrives in odd-sized pieces


def test_concatenated_gzip_members_read_as_one_stream(folder, tmp_path):
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(folder / "manifest.json", arcname="manifest.json")
    raw = plain.getvalue()
    split = gzip.compress(raw[:700]) + gzip.compress(raw[700:])  # `cat a.gz b.gz`
    assert entries(split) == [("manifest.json", "file", b'{"short": true}')]


def raw_member(name: str, data: bytes, kind: bytes = tarfile.REGTYPE, fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    """A member (header from tarfile's writer, data, padding), whatever its type says."""
    info = tarfile.TarInfo(name)
    info.size, info.type = len(data), kind
    return info.tobuf(format=fmt) + data + bytes(-len(data) % 512)


def pax_record(key: str, value: str) -> bytes:
    """One pax record, 'LENGTH KEY=VALUE\\n', LENGTH counting itself."""
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


def end() -> bytes:
    return bytes(1024)


def test_long_names_and_pax_headers_are_capped_before_they_are_read():
    at_cap = "d/" + "n" * (MAX_LONG_NAME - 3)  # with its NUL, exactly the cap
    assert len(at_cap.encode()) + 1 == MAX_LONG_NAME
    fits = (
        raw_member("././@LongLink", at_cap.encode() + b"\0", tarfile.GNUTYPE_LONGNAME)
        + raw_member("short", b"x")
        + end()
    )
    assert entries(fits) == [(at_cap, "file", b"x")]
    over = (
        raw_member("././@LongLink", b"n" * (MAX_LONG_NAME + 1), tarfile.GNUTYPE_LONGNAME)
        + raw_member("short", b"x")
        + end()
    )
    with pytest.raises(
        InputFileError,
        match=rf"'././@LongLink' is a GNU long name of {MAX_LONG_NAME + 1} bytes; at most {MAX_LONG_NAME}",
    ):
        entries(over)
    big_pax = b"x" * (MAX_PAX_HEADER + 1)
    with pytest.raises(InputFileError, match=rf"pax header of {len(big_pax)} bytes; at most {MAX_PAX_HEADER}"):
        entries(raw_member("PaxHeaders/x", big_pax, tarfile.XHDTYPE) + raw_member("short", b"x") + end())
    fits = pax_record("path", "p/" + "q" * 60_000)
    assert len(fits) <= MAX_PAX_HEADER
    assert entries(raw_member("PaxHeaders/x", fits, tarfile.XHDTYPE) + raw_member("short", b"x") + end()) == [
        ("p/" + "q" * 60_000, "file", b"x")
    ]
    # a declared size is refused from the header alone: the reader never waits for the bytes
    info = tarfile.TarInfo("././@LongLink")
    info.size, info.type = 1 << 33, tarfile.GNUTYPE_LONGNAME
    with pytest.raises(InputFileError, match="GNU long name of 8589934592 bytes"):
        entries(info.tobuf(format=tarfile.GNU_FORMAT))


def test_every_decompressed_byte_counts_toward_the_limit_headers_and_padding_included():
    empties = b"".join(raw_member(f"junk/{i}", b"") for i in range(2048)) + end()  # 1 MiB of headers, no data
    assert len(entries(empties, limit=len(empties))) == 2048
    with pytest.raises(
        PayloadTooLargeError,
        match=r"decompressed and counting its headers, is larger than this server's limit of 1048575",
    ):
        entries(empties, limit=(1 << 20) - 1)
    one = raw_member("a", b"x") + end()  # header 512 + data 1 padded to 512 + the end block read: 1536
    assert entries(one, limit=1536) == [("a", "file", b"x")]
    with pytest.raises(PayloadTooLargeError):
        entries(one, limit=1535)
    info = tarfile.TarInfo("huge")
    info.size = 1 << 40
    with pytest.raises(PayloadTooLargeError):  # refused from the declared size, before any data arrives
        entries(info.tobuf(format=tarfile.GNU_FORMAT), limit=8 << 20)


def test_a_gzip_bomb_is_refused_without_inflating_it():
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    info = tarfile.TarInfo("zeros")
    info.size = 256 << 20
    parts = [compressor.compress(info.tobuf(format=tarfile.USTAR_FORMAT))]
    parts += [compressor.compress(bytes(1 << 20)) for _ in range(256)]
    bomb = b"".join(parts) + compressor.compress(end()) + compressor.flush()
    assert len(bomb) < 300_000
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLargeError):
            entries(bomb, limit=8 << 20)
        read = 0  # under a limit that allows it, the member is read through, one piece at a time
        for entry in read_tar(io.BytesIO(bomb), 300 << 20, lambda: too_large(300 << 20)):
            for piece in entry.chunks():
                read += len(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert read == 256 << 20
    assert peak < 16 << 20, f"reading the bomb held {peak >> 20} MiB"


def test_malformed_archives_are_refused_naming_the_problem():
    good = raw_member("manifest.json", b"{}") + end()
    broken_checksum = bytearray(good)
    broken_checksum[0] ^= 1
    octal = bytearray(good)
    octal[124:136] = b"0000000009\0\0"
    cases = {
        "checksum": (bytes(broken_checksum), "checksum does not match"),
        "size field": (_rechecksummed(octal), "is not an octal number"),
        "truncated data": (raw_member("manifest.json", b"{}" * 400)[:700], "ends inside a member"),
        "truncated header": (good[:300], "ends inside a header"),
        "empty": (b"", "it is empty"),
        "damaged gzip": (gzip.compress(good)[:-30] + b"\xff" * 30, "compressed stream|ends inside"),
        "long name then end": (
            raw_member("././@LongLink", b"x\0", tarfile.GNUTYPE_LONGNAME) + end(),
            "ends right after a long-name",
        ),
        "malformed pax": (
            raw_member("PaxHeaders/x", b"12 path\n", tarfile.XHDTYPE) + good,
            "pax header record at byte 0 is malformed",
        ),
        "sparse": (
            raw_member("PaxHeaders/x", pax_record("GNU.sparse.major", "1"), tarfile.XHDTYPE) + good,
            "sparse file",
        ),
    }
    for label, (data, message) in cases.items():
        with pytest.raises(InputFileError, match=message):
            entries(data)
            pytest.fail(f"{label} was accepted")


def _rechecksummed(block: bytearray) -> bytes:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block[:512])
    return bytes(block)


def test_links_and_devices_are_reported_as_what_they_are():
    link = tarfile.TarInfo("manifest.json")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    device = tarfile.TarInfo("dev")
    device.type = tarfile.CHRTYPE
    data = link.tobuf() + device.tobuf() + raw_member("dir/", b"", tarfile.AREGTYPE) + end()
    assert [(name, kind) for name, kind, _ in entries(data)] == [
        ("manifest.json", "link"),
        ("dev", "device"),
        ("dir/", "directory"),
    ]
