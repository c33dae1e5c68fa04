"""Moving bytes to and from a registry server: streamed uploads and downloads with byte progress,
safe bundle extraction.

Nothing is held in memory whole: a model file or an artifact folder (tarred on the fly, so its
Content-Length is known before the first byte) is read in chunks as the request body, and a
bundle is streamed into a temporary file. A bundle is extracted only if every member is a
regular file named `manifest.json` or `blobs/<sha256>.safetensors` (no links, no absolute or
`..` paths), so a hostile server cannot write outside the temporary folder.

A folder is sent manifest first, then its normalizers' blobs and structure parts, so the server can gate it early;
blobs the server already holds for the token (POST /api/v1/blobs/present) are left out.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from schemas.errors import InputFileError, IntegrityError
from schemas.manifest import ArtifactManifest, load_manifest

from .bundle_stream import gated_digests
from .manifest_io import BLOBS_DIR, BUNDLE_ERROR_FILE, MANIFEST_FILE
from .streamed_blobs import BlobMap
from .tar_reader import TarFormatError, read_tar

CHUNK = 1 << 20
BLOCK = tarfile.BLOCKSIZE  # 512

#: advance(bytes_done): reports how far a transfer is.
Advance = Callable[[int], None]
#: transfer(description, total_bytes | None) -> a context manager yielding `advance`; the CLI draws a bar from it.
TransferProgress = Callable[[str, "int | None"], AbstractContextManager[Advance]]

_BLOB_MEMBER = re.compile(rf"^{BLOBS_DIR}/[0-9a-f]{{64}}\.safetensors$")


def no_progress(description: str, total: int | None) -> AbstractContextManager[Advance]:
    return nullcontext(lambda done: None)


# -- uploads -----------------------------------------------------------------------------------


def file_chunks(path: Path, advance: Advance) -> Iterator[bytes]:
    """The file's bytes in chunks; `advance` gets the running byte count."""
    done = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            done += len(chunk)
            yield chunk
            advance(done)


def bytes_chunks(data: bytes, advance: Advance) -> Iterator[bytes]:
    """`data` in chunks, as file_chunks gives a file's (an ONNX model with its external data embedded for an upload)."""
    for start in range(0, len(data), CHUNK):
        yield data[start : start + CHUNK]
        advance(min(start + CHUNK, len(data)))


#: A tar member to send: (name, size, its bytes a chunk at a time).
Member = tuple[str, int, Callable[[], Iterator[bytes]]]


def _file_member(name: str, path: Path) -> Member:
    def chunks() -> Iterator[bytes]:
        with open(path, "rb") as handle:
            while chunk := handle.read(CHUNK):
                yield chunk

    return name, path.stat().st_size, chunks


def _folder_members(folder: Path, skip: frozenset[str] = frozenset()) -> list[Member]:
    """The members of an artifact folder's tar; nothing but the manifest and the blobs (less those in `skip`, which the
    server already holds for this token) is sent.

    The manifest goes first, then the blobs of the normalizers' tensors and the structure parts, then the bulk: the
    server starts the equivalence gate (and the structure check) as soon as it has the first two, while the bulk is
    still on the way.
    """
    members = [_file_member(MANIFEST_FILE, folder / MANIFEST_FILE)]
    blobs = folder / BLOBS_DIR
    if blobs.is_dir():
        gated = _gated_digests(folder / MANIFEST_FILE)
        files = [
            p for p in sorted(blobs.iterdir()) if p.is_file() and p.suffix == ".safetensors" and p.stem not in skip
        ]
        files.sort(key=lambda p: p.stem not in gated)  # stable: the gated blobs first, each group sorted
        members += [_file_member(f"{BLOBS_DIR}/{p.name}", p) for p in files]
    return members


def artifact_members(manifest: ArtifactManifest, blobs: BlobMap, skip: frozenset[str] = frozenset()) -> list[Member]:
    """The members of the tar of an artifact built in memory (its blobs streamed from where the model's files hold their
    tensors: a checkpoint folder sent as a bundle), in the order `_folder_members` sends a saved one."""
    document = (manifest.to_json() + "\n").encode()
    gated = gated_digests(manifest)
    digests = sorted((d for d in manifest.blob_digests() if d not in skip), key=lambda d: (d not in gated, d))
    return [
        (MANIFEST_FILE, len(document), lambda: iter([document])),
        *((f"{BLOBS_DIR}/{d}.safetensors", blobs.size(d), lambda d=d: blobs.chunks(d)) for d in digests),
    ]


def _gated_digests(manifest_path: Path) -> set[str]:
    """Digests of the normalizers' tensors and the structure parts; empty when the manifest is unreadable
    (the server reports that)."""
    try:
        return gated_digests(load_manifest(json.loads(manifest_path.read_text())))
    except Exception:  # noqa: BLE001 - the order is only an optimisation; the server names what is wrong
        return set()


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _padding(size: int) -> int:
    return (BLOCK - size % BLOCK) % BLOCK


def folder_blob_digests(folder: Path) -> list[str]:
    """The digests an artifact folder's blob files are named by."""
    blobs = folder / BLOBS_DIR
    return (
        sorted(p.stem for p in blobs.iterdir() if p.is_file() and p.suffix == ".safetensors") if blobs.is_dir() else []
    )


def folder_tar_size(folder: Path, skip: frozenset[str] = frozenset()) -> int:
    """Exact length of the tar `folder_tar_chunks` produces (so the upload can send Content-Length)."""
    return tar_size(_folder_members(folder, skip))


def folder_tar_chunks(folder: Path, advance: Advance, skip: frozenset[str] = frozenset()) -> Iterator[bytes]:
    """An artifact folder as a tar stream, produced while it is sent (headers, file chunks, padding, end blocks)."""
    return tar_chunks(_folder_members(folder, skip), advance)


def tar_size(members: list[Member]) -> int:
    """Exact length of the tar `tar_chunks` produces from `members`."""
    return sum(len(_header(name, size)) + size + _padding(size) for name, size, _ in members) + 2 * BLOCK


def tar_chunks(members: list[Member], advance: Advance) -> Iterator[bytes]:
    """`members` as a tar stream, produced while it is sent; a member whose bytes are not its size stops the stream."""
    done = 0
    for name, size, chunks in members:
        header = _header(name, size)
        done += len(header)
        yield header
        sent = 0
        for chunk in chunks():
            sent += len(chunk)
            if sent > size:
                break
            done += len(chunk)
            yield chunk
            advance(done)
        if sent != size:
            raise InputFileError(
                f"'{name}' changed while it was being sent ({sent} bytes, not {size}); register it again."
            )
        pad = _padding(size)
        if pad:
            done += pad
            yield b"\0" * pad
        advance(done)
    done += 2 * BLOCK
    yield b"\0" * (2 * BLOCK)
    advance(done)


# -- downloads ---------------------------------------------------------------------------------


def save_stream(chunks: Iterator[bytes], target: Path, advance: Advance) -> int:
    """Write a response body to `target` chunk by chunk; returns the byte count."""
    done = 0
    with open(target, "wb") as handle:
        for chunk in chunks:
            handle.write(chunk)
            done += len(chunk)
            advance(done)
    return done


def extract_bundle(archive: Path, folder: Path) -> Path:
    """Extract a bundle tar into `folder` after checking every member; IntegrityError for anything unexpected.

    The tar is read by tar_reader, bounded: names and pax headers are capped, and no more bytes are written than
    the archive holds, whatever a hostile server sends.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / BLOBS_DIR).mkdir(exist_ok=True)
    size = archive.stat().st_size

    def too_large() -> IntegrityError:
        return IntegrityError(
            f"the downloaded bundle holds more than its {size} bytes once decompressed; it was not used: "
            "check that --server points at a normbridge server."
        )

    try:
        with open(archive, "rb") as handle:
            for member in read_tar(handle, size, too_large):
                name = member.name.removeprefix("./")
                if member.kind == "directory" and name.rstrip("/") in ("", ".", BLOBS_DIR):
                    continue
                if member.kind != "file" or not (name == MANIFEST_FILE or _BLOB_MEMBER.match(name)):
                    raise IntegrityError(
                        f"the bundle holds an unexpected member '{member.name}'; a bundle holds only {MANIFEST_FILE} and "
                        f"{BLOBS_DIR}/<sha256>.safetensors regular files: check that --server points at a normbridge server."
                    )
                with open(folder / name, "wb") as out:
                    for chunk in member.chunks():
                        out.write(chunk)
    except TarFormatError as error:
        raise InputFileError(
            f"the downloaded bundle is not a valid tar archive ({error.problem}); retry, or check the server's log."
        ) from error
    return folder


def server_error_in(archive: Path) -> str | None:
    """The message of the error member a normbridge server ends a stopped bundle with (BUNDLE_ERROR_FILE), or None."""
    try:
        with open(archive, "rb") as handle:
            for member in read_tar(handle, archive.stat().st_size, lambda: InputFileError("past the file's length")):
                if member.name == BUNDLE_ERROR_FILE and member.kind == "file" and member.size <= 64 * 1024:
                    message = json.loads(member.read())["error"]["message"]
                    return message[:2000] if isinstance(message, str) else None
    except (
        InputFileError,
        ValueError,
        KeyError,
        TypeError,
    ):  # the body was cut: what came before the cut is all there is
        return None
    return None


__all__ = [
    "Advance",
    "Member",
    "TransferProgress",
    "artifact_members",
    "bytes_chunks",
    "extract_bundle",
    "file_chunks",
    "folder_blob_digests",
    "folder_tar_chunks",
    "folder_tar_size",
    "server_error_in",
    "tar_chunks",
    "tar_size",
    "no_progress",
    "save_stream",
]
