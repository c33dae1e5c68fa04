"""Reading a tar stream (plain, gzip, bzip2 or xz) with memory and size bounded whatever the bytes say.

The standard library's stream reader inflates a whole compressed read at once and reads GNU
long names and pax headers whole, so a small gzip body could make it hold gigabytes. This reader
parses the 512-byte ustar headers itself and supports exactly what `tar` and Python's tarfile
write for a folder of files: regular files, directories, GNU long names ('L', at most
MAX_LONG_NAME bytes) and pax headers ('x', 'g', at most MAX_PAX_HEADER bytes; their `path` and
`size` records are used). Every decompressed byte, headers and padding included, counts toward
the limit, and decompression produces at most one read's worth at a time, so a bomb is refused
after `limit` bytes of work, never inflated. Other entries (links, devices, sparse files) are
yielded with their kind for the caller to refuse; a malformed header is refused here.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from schemas.errors import InputFileError, NormbridgeError

BLOCK = 512
CHUNK = 1 << 20
MAX_LONG_NAME = 4096
MAX_PAX_HEADER = 64 * 1024
_REGULAR, _DIRECTORY = (b"0", b"\0", b"7"), b"5"
_LINKS, _DEVICES = (b"1", b"2"), (b"3", b"4", b"6")
_COMPRESSED: dict[bytes, Callable[[], object]] = {
    b"\x1f\x8b": lambda: zlib.decompressobj(16 + zlib.MAX_WBITS),
    b"BZh": bz2.BZ2Decompressor,
    b"\xfd7zXZ\x00": lzma.LZMADecompressor,
}


@dataclass
class TarEntry:
    """One member: its name (long names and pax paths applied), data size and kind ('file', 'directory', 'link',
    'device' or 'other'). `read()` returns its data; whatever is not read is skipped before the next member."""

    name: str
    size: int
    kind: str
    read: Callable[[], bytes]
    chunks: Callable[[], Iterator[bytes]]


class TarFormatError(InputFileError):
    """The bytes are not a tar archive this reader accepts; `problem` says where they stop being one."""

    def __init__(self, problem: str):
        self.problem = problem
        super().__init__(
            f"the bundle is not a readable tar archive ({problem}); send `tar -cf - -C FOLDER .` of an artifact folder."
        )


def bad_tar(problem: str) -> TarFormatError:
    return TarFormatError(problem)


class _Decompressed:
    """The inflated bytes of a compressed stream, at most `size` per read (the engine keeps the rest compressed)."""

    def __init__(self, stream: BinaryIO, head: bytes, new_engine: Callable[[], object]):
        self.stream, self.new_engine = stream, new_engine
        self.engine, self.input = new_engine(), head

    def read(self, size: int) -> bytes:
        while True:
            if self.engine.eof:  # one gzip member / bz2 stream ended: another may follow (as `cat a.gz b.gz` makes)
                leftover = self.engine.unused_data or self.stream.read(CHUNK)
                if not leftover:
                    return b""
                self.engine, self.input = self.new_engine(), leftover
            try:
                out = self.engine.decompress(self.input, size)
            except (zlib.error, OSError, EOFError, lzma.LZMAError) as error:
                raise bad_tar(f"its compressed stream is damaged: {error}") from error
            self.input = getattr(self.engine, "unconsumed_tail", b"")
            if out:
                return out
            if not self.engine.eof:
                more = self.stream.read(CHUNK)
                if not more:
                    raise bad_tar("its compressed stream ends early")
                self.input += more


class _Counted:
    """Exact reads from the (decompressed) tar; every byte counts toward `limit`, the `too_large()` error past it."""

    def __init__(self, source, limit: int, too_large: Callable[[], NormbridgeError]):
        self.source, self.limit, self.too_large = source, limit, too_large
        self.total = 0
        self.buffer = b""

    def reserve(self, size: int) -> None:
        """Refuse before reading when `size` more bytes would pass the limit."""
        if self.total + size > self.limit:
            raise self.too_large()

    def read(self, size: int, exact: bool = True) -> bytes:
        self.reserve(size)
        parts, wanted = [], size
        if self.buffer:
            parts.append(self.buffer[:wanted])
            self.buffer = self.buffer[wanted:]
            wanted -= len(parts[0])
        while wanted:
            piece = self.source.read(min(wanted, CHUNK))
            if not piece:
                break
            if len(piece) > wanted:  # a reader that returned more than asked: keep the rest
                piece, self.buffer = piece[:wanted], piece[wanted:]
            parts.append(piece)
            wanted -= len(piece)
        data = b"".join(parts)
        self.total += len(data)
        if exact and len(data) != size:
            raise bad_tar(f"it ends inside a member, {size - len(data)} bytes short")
        return data


def open_tar_source(stream: BinaryIO) -> tuple[object, bytes]:
    """(a reader of the tar's bytes, decompressing when the stream starts with a gzip, bzip2 or xz signature, its first
    bytes already read for a plain tar)."""
    head = b""
    while len(head) < 6:
        piece = stream.read(6 - len(head))
        if not piece:
            break
        head += piece
    for magic, engine in _COMPRESSED.items():
        if head.startswith(magic):
            return _Decompressed(stream, head, engine), b""
    return stream, head


def _number(field: bytes, what: str) -> int:
    """A numeric header field: octal text, or GNU base-256 (first byte 0x80) for large values."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    if field[:1] == b"\xff":
        raise bad_tar(f"a header's {what} is negative")
    text = field.split(b"\0", 1)[0].strip()
    if text and not text.isdigit() or b"8" in text or b"9" in text:
        raise bad_tar(f"a header's {what} field {field!r} is not an octal number")
    return int(text or b"0", 8)


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "replace")


def _header(block: bytes) -> tuple[str, int, bytes]:
    """(name, size, type flag) of a 512-byte header, its checksum verified."""
    stored = _number(block[148:156], "checksum")
    unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
    signed = unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127)  # old writers summed signed chars
    if stored not in (unsigned, signed):
        raise bad_tar("a header's checksum does not match its bytes")
    name, size, kind = _text(block[:100]), _number(block[124:136], "size"), block[156:157]
    if block[257:265] == b"ustar\x0000" and block[345] != 0:  # POSIX ustar: a long path is split into prefix/name
        name = f"{_text(block[345:500])}/{name}"
    return name, size, kind


def _pax_records(data: bytes) -> dict[str, str]:
    """The `path` and `size` records of a pax header ('LENGTH KEY=VALUE\\n' each); other keys are read and dropped."""
    records, position = {}, 0
    while position < len(data) and data[position] != 0:
        space = data.find(b" ", position, position + 20)
        length = data[position:space]
        if space < 0 or not length.isdigit() or int(length) <= space - position or position + int(length) > len(data):
            raise bad_tar(f"a pax header record at byte {position} is malformed")
        record = data[space + 1 : position + int(length)]
        key, equals, value = record.partition(b"=")
        if not equals or not record.endswith(b"\n"):
            raise bad_tar(f"a pax header record at byte {position} is malformed")
        key_text = key.decode("utf-8", "replace")
        if key_text.startswith("GNU.sparse."):
            raise InputFileError("the bundle holds a sparse file (pax GNU.sparse records); pack only regular files.")
        if key_text in ("path", "size"):
            records[key_text] = value[:-1].decode("utf-8", "replace")
        position += int(length)
    if "size" in records and not records["size"].isdigit():
        raise bad_tar(f"a pax size record {records['size'][:40]!r} is not a number")
    return records


def _kind(flag: bytes, name: str) -> str:
    if flag in _REGULAR:
        return "directory" if flag == b"\0" and name.endswith("/") else "file"
    return {_DIRECTORY: "directory"}.get(flag) or (
        "link" if flag in _LINKS else "device" if flag in _DEVICES else "other"
    )


def _extension(tar: _Counted, flag: bytes, size: int, name: str) -> bytes:
    """The data of a long-name or pax header, refused (before it is read) beyond its cap."""
    cap, what = {b"L": (MAX_LONG_NAME, "GNU long name"), b"K": (MAX_LONG_NAME, "GNU long link name")}.get(
        flag, (MAX_PAX_HEADER, "pax header")
    )
    if size > cap:
        raise InputFileError(
            f"bundle member '{name[:100]}' is a {what} of {size} bytes; at most {cap} are accepted, "
            "so pack the artifact folder with shorter paths."
        )
    return tar.read(_padded(size))[:size]


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def read_tar(stream: BinaryIO, limit: int, too_large: Callable[[], NormbridgeError]) -> Iterator[TarEntry]:
    """Every member of the tar in `stream`, in order, until its end-of-archive block; see the module doc."""
    source, head = open_tar_source(stream)
    tar = _Counted(source, limit, too_large)
    tar.buffer = head
    global_pax: dict[str, str] = {}
    pax: dict[str, str] = {}
    long_name: str | None = None
    while True:
        block = tar.read(BLOCK, exact=False)
        if not block or block == bytes(BLOCK):
            if long_name is not None or pax:
                raise bad_tar("it ends right after a long-name or pax header")
            if not block and tar.total == 0:
                raise bad_tar("it is empty")
            return
        if len(block) != BLOCK:
            raise bad_tar(f"it ends inside a header, {BLOCK - len(block)} bytes short")
        name, size, flag = _header(block)
        if flag in (b"L", b"K", b"x", b"g"):
            data = _extension(tar, flag, size, name)
            if flag == b"L":
                long_name = _text(data)
            elif flag == b"x":
                pax = _pax_records(data)
            elif flag == b"g":
                global_pax.update(_pax_records(data))
            continue
        records = {**global_pax, **pax}
        name = records.get("path", long_name if long_name is not None else name)
        size = int(records["size"]) if "size" in records else size
        long_name, pax = None, {}
        yield from _member(tar, name, size, _kind(flag, name))


def _member(tar: _Counted, name: str, size: int, kind: str) -> Iterator[TarEntry]:
    """Yield one member, then skip what the caller left unread and the padding."""
    tar.reserve(_padded(size))
    left = [size]

    def chunks() -> Iterator[bytes]:
        while left[0]:
            piece = tar.read(min(left[0], CHUNK))
            left[0] -= len(piece)
            yield piece

    def read() -> bytes:
        return b"".join(chunks())

    yield TarEntry(name, size, kind, read, chunks)
    for _ in chunks():
        pass
    tar.read(_padded(size) - size)


__all__ = ["MAX_LONG_NAME", "MAX_PAX_HEADER", "TarEntry", "TarFormatError", "bad_tar", "open_tar_source", "read_tar"]
