"""Receiving an artifact bundle as it streams in: one tar member at a time, checked on arrival.

A bundle is a tar of an artifact folder (manifest.json and blobs/<sha256>.safetensors), at the
top level or inside one folder. It is read as a stream (tar_reader, bounded), so no member is written to
disk or read twice: each blob is hashed as it arrives and staged in the blob store (unreferenced
until the commit), and the equivalence gate (then the structure check, registry/service/structure_check.py) starts
in its own thread as soon as the manifest, the blobs its normalizers use and the structure parts have arrived, while
the bulk weights are still on the wire. Links,
devices, unsafe paths, a blob that does not hash to its name, a tensor whose header disagrees
with the manifest and a bundle past the size limit are refused; whatever was staged is discarded.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import BinaryIO

from schemas.errors import InputFileError, NotFoundError, PayloadTooLargeError
from schemas.manifest import ArtifactManifest, load_manifest, sha256_hex

from .manifest_io import BLOBS_DIR, MANIFEST_FILE, specs_from_manifest
from .blobs.base import HEX_DIGITS, BlobStore, StagedBlob
from .tar_reader import read_tar
from .tensor_blobs import check_tensor_header

#: Bytes read at a time from the body after the archive ends.
READ_SIZE = 1 << 20

MAX_MEMBERS = 100_000
#: Bytes of blobs queued for the blob store before the reader (and so the uploading client) waits.
STAGING_WINDOW = 256 << 20

#: gate(manifest, specs, held) -> the CheckResults (raises CheckFailedError); Registry._gate, then the structure check
#: on the structure parts' bytes, which `held(digest)` gives (with the normalizers' blobs).
Gate = Callable[[ArtifactManifest, list, Callable[[str], bytes]], list]
#: reuse(digests) -> the subset the bundle may leave out because the store holds them for this uploader (the HTTP
#: layer allows blobs of models the token may read); None: every blob must be in the bundle.
Reuse = Callable[[set[str]], set[str]]
HEADER_READ = 64 * 1024  # bytes read from a stored blob to check its safetensors header


class UploadInterrupted(InputFileError):
    """The upload stopped before its end (the client went away): nothing was attempted, so nothing is audited."""


@dataclass
class BundleMember:
    """A manifest (digest None) or a blob whose bytes hash to `digest`."""

    data: bytes
    digest: str | None = None


@dataclass
class ReceivedBundle:
    """A whole, checked bundle: its manifest, its blobs staged in manifest order, and the gate's passing checks."""

    manifest: ArtifactManifest
    staged: list[StagedBlob]
    checks: list


def too_large(limit: int, decompressed: bool = False) -> PayloadTooLargeError:
    what = "the upload's tar, decompressed and counting its headers," if decompressed else "the upload"
    return PayloadTooLargeError(
        f"{what} is larger than this server's limit of {limit} bytes; "
        "raise `normbridge serve --max-upload-mb` or upload a smaller file."
    )


def member_path(name: str, folder: bool = False) -> PurePosixPath:
    """A member's path, refused unless it is relative and stays inside the bundle; a `folder` may be the bundle's own
    root ('./', the first member of `tar -cf - -C FOLDER .`)."""
    path = PurePosixPath(name)
    parts = [p for p in path.parts if p not in ("", ".")]
    if folder and not parts and not path.is_absolute() and "\\" not in name:
        return PurePosixPath(".")
    if path.is_absolute() or not parts or any(p == ".." for p in parts) or "\\" in name:
        raise InputFileError(
            f"bundle member '{name}' has an unsafe path; a bundle holds only relative paths inside the artifact folder."
        )
    return PurePosixPath(*parts)


def _role(path: PurePosixPath) -> tuple[str, str | None] | None:
    """(the artifact folder it sits in, blob digest or None for the manifest), or None for any other file."""
    parts = path.parts
    if parts[-1] == MANIFEST_FILE and len(parts) <= 2:
        return "/".join(parts[:-1]), None
    if len(parts) in (2, 3) and parts[-2] == BLOBS_DIR and parts[-1].endswith(".safetensors"):
        digest = parts[-1].removesuffix(".safetensors")
        if len(digest) == 64 and set(digest) <= HEX_DIGITS:
            return "/".join(parts[:-2]), digest
    return None


def read_bundle_stream(stream: BinaryIO, limit: int) -> Iterator[BundleMember]:
    """The manifest and blob members of a bundle tar (plain or compressed) in the order they arrive;
    other files are skipped.

    The tar is read by tar_reader: `limit` bounds its decompressed bytes, headers and padding included, and long names
    and pax headers are capped, so memory stays near one blob whatever the body holds.
    """
    members = 0
    folder: str | None = None
    for entry in read_tar(stream, limit, lambda: too_large(limit, decompressed=True)):
        members += 1
        if members > MAX_MEMBERS:
            raise InputFileError(
                f"the bundle has more than {MAX_MEMBERS} members; a bundle holds one manifest and its blobs."
            )
        path = member_path(entry.name, folder=entry.kind == "directory")
        if entry.kind == "directory":
            continue
        if entry.kind != "file":
            raise InputFileError(
                f"bundle member '{entry.name}' is not a regular file (links and devices are refused); "
                "pack only the manifest and blob files."
            )
        role = _role(path)
        if role is None:
            continue  # not part of the artifact; the reader skips its bytes
        where, digest = role
        if folder is None:
            folder = where
        elif where != folder:
            raise InputFileError(
                f"the bundle holds artifact files in both '{folder or '.'}' and '{where or '.'}'; pack one artifact folder."
            )
        data = entry.read()
        if digest is not None and sha256_hex(data) != digest:
            raise InputFileError(
                f"bundle member '{entry.name}' does not hash to its name (sha256 {sha256_hex(data)[:12]}...): "
                "it was corrupted or modified; export the artifact again."
            )
        yield BundleMember(data, digest)
    _read_to_end(stream)


def _read_to_end(stream: BinaryIO) -> None:
    """Read what follows the archive's end (tar padding, or more): a bundle is registered only once its upload arrived
    whole, so a body past the size limit fails here (the HTTP body pipe raises PayloadTooLargeError) and never
    commits."""
    while stream.read(READ_SIZE):
        pass


def _parse_manifest(data: bytes) -> ArtifactManifest:
    try:
        return load_manifest(json.loads(data))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputFileError(
            f"the bundle's {MANIFEST_FILE} is not valid JSON ({error}); export the artifact again."
        ) from error


def gated_digests(manifest: ArtifactManifest) -> set[str]:
    """The blobs the equivalence gate needs: those of the normalizers' spec tensors, and the structure parts (small; the
    structure is checked beside the gate)."""
    parts = {ref.digest for ref in manifest.structure.parts.values()} if manifest.structure is not None else set()
    return parts | {
        manifest.tensors[t].digest
        for entry in manifest.normalizers
        for t in entry.tensors.values()
        if t in manifest.tensors
    }


def receive_bundle(
    stream: BinaryIO,
    limit: int,
    store: BlobStore,
    gate: Gate,
    reuse: Reuse | None = None,
    claim: Callable[[set[str]], None] | None = None,
) -> ReceivedBundle:
    """Read, check and stage a whole bundle from `stream`, gating it as early as its members allow; see the module doc.

    With `reuse`, the bundle may leave out blobs the store already holds for this uploader (a fine-tune that moved
    only the running statistics then sends only those): each is checked against the manifest from its stored header,
    and the normalizers' ones are read (re-hashed) for the gate. `claim(digests)` is called with every blob digest of
    the manifest as soon as it is read, before the store is looked at (the registry leases them against gc).
    """
    with (
        ThreadPoolExecutor(max_workers=max(1, store.parallel_transfers), thread_name_prefix="stage") as stager,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="gate") as gater,
    ):
        receiver = _Receiver(store, gate, stager, gater, reuse, claim)
        try:
            for member in read_bundle_stream(stream, limit):
                if member.digest is None:
                    receiver.take_manifest(member.data)
                else:
                    receiver.take_blob(member.digest, member.data)
            return receiver.finish()
        except BaseException:
            stager.shutdown(wait=True)
            receiver.discard()
            raise


class _Receiver:
    """One bundle on its way in. Memory stays near what is in flight when the manifest comes first: a bulk blob's bytes
    are dropped once staged, only the normalizers' blobs and the structure parts are kept (for the gate and the
    structure check), and the reader, so the sender, waits while more than STAGING_WINDOW bytes are queued for the
    store. Blobs that arrive before the manifest are held until it comes (a manifest-last tar costs its size in
    memory)."""

    def __init__(
        self,
        store: BlobStore,
        gate: Gate,
        stager: ThreadPoolExecutor,
        gater: ThreadPoolExecutor,
        reuse: Reuse | None = None,
        claim: Callable[[set[str]], None] | None = None,
    ):
        self.store, self.gate, self.stager, self.gater, self.reuse, self.claim = (
            store,
            gate,
            stager,
            gater,
            reuse,
            claim,
        )
        self.manifest: ArtifactManifest | None = None
        self.refs: dict = {}
        self.names: dict[str, list[str]] = {}  # digest -> the manifest tensors it holds
        self.needed: set[str] = set()  # the normalizers' blobs and the structure parts
        self.early: dict[str, bytes] = {}  # arrived before the manifest
        self.gated: dict[str, bytes] = {}
        self.staging: dict[str, Future] = {}
        self.checked: Future | None = None
        self.window = _Window(STAGING_WINDOW)

    def take_manifest(self, data: bytes) -> None:
        if self.manifest is not None:
            raise InputFileError(f"the bundle holds {MANIFEST_FILE} twice; pack one artifact folder.")
        self.manifest = _parse_manifest(data)
        self.refs = self.manifest.blob_refs()  # the tensors and the structure parts, each a single-tensor blob
        for name, ref in self.refs.items():
            self.names.setdefault(ref.digest, []).append(name)
        if self.claim is not None:
            self.claim(set(self.names))
        self.needed = gated_digests(self.manifest)
        early, self.early = self.early, {}
        for digest, blob in early.items():
            self._accept(digest, blob)
        # normalizer blobs the store already holds for this uploader: the gate need not wait for them
        for digest in self._reusable(self.needed - self.staging.keys()):
            self._accept(digest, self.store.get(digest), stored=True)
        self._gate_when_ready()

    def take_blob(self, digest: str, data: bytes) -> None:
        if digest in self.staging or digest in self.early:
            return
        if self.manifest is None:
            self.early[digest] = data
            return
        self._accept(digest, data)
        self._gate_when_ready()

    def _accept(self, digest: str, data: bytes, stored: bool = False) -> None:
        """Check the blob against every tensor the manifest says it holds, then stage it (unless `stored`: the store
        holds it already); unreferenced blobs are dropped."""
        names = self.names.get(digest)
        if not names:
            return
        for name in names:
            check_tensor_header(data, self.refs[name], name)
        if digest in self.needed:
            self.gated[digest] = data
        if stored:
            self.staging[digest] = _done(StagedBlob(digest=digest))
        else:
            self.staging[digest] = self.window.submit(self.stager, self.store.stage, data, digest)

    def _reusable(self, digests: set[str]) -> set[str]:
        return self.reuse(set(digests)) & set(digests) if self.reuse is not None and digests else set()

    def _check_stored(self, digest: str) -> None:
        """A blob left out of the bundle: checked against the manifest from the header the store holds."""
        try:
            head, total = self.store.head_of(digest, HEADER_READ)
        except NotFoundError as error:
            raise NotFoundError(
                f"tensor '{self.names[digest][0]}' was left out of the bundle, but {error}; send the bundle whole."
            ) from None
        length = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
        if 8 + length > len(head) and 8 + length <= total:
            head, total = self.store.head_of(digest, 8 + length)
        for name in self.names[digest]:
            check_tensor_header(head, self.refs[name], name, total)

    def _gate_when_ready(self) -> None:
        if self.checked is None and self.manifest is not None and self.needed <= self.gated.keys():
            self.checked = self.gater.submit(_specs_then_gate, self.manifest, dict(self.gated), self.gate)

    def finish(self) -> ReceivedBundle:
        """After the last member: everything the manifest lists arrived, the gate passed, every blob is staged."""
        if self.manifest is None:
            raise InputFileError(
                f"the bundle holds no {MANIFEST_FILE}; pack an artifact folder (manifest.json and blobs/)."
            )
        reused = sorted(self._reusable(set(self.names) - self.staging.keys()))
        for digest, check in [(d, self.stager.submit(self._check_stored, d)) for d in reused]:  # header reads overlap
            check.result()
            self.staging[digest] = _done(StagedBlob(digest=digest))
        for name, ref in self.refs.items():
            if ref.digest not in self.staging:
                reusing = (
                    " (it may be left out only when a version this uploader may read holds it)" if self.reuse else ""
                )
                raise InputFileError(
                    f"the blob of tensor '{name}' (blobs/{ref.digest}.safetensors) is missing from the bundle{reusing}; "
                    "export the artifact again."
                )
        checks = self.checked.result()
        return ReceivedBundle(self.manifest, [self.staging[d].result() for d in self.manifest.blob_digests()], checks)

    def discard(self) -> None:
        for future in self.staging.values():
            if future.done() and future.exception() is None:
                self.store.discard(future.result())


class _Window:
    """At most `budget` bytes handed to a pool and not yet done; a submit beyond it waits (one blob always fits)."""

    def __init__(self, budget: int):
        self.budget, self.used = budget, 0
        self.changed = threading.Condition()

    def submit(self, pool: ThreadPoolExecutor, task: Callable, data: bytes, *args) -> Future:
        size = len(data)
        with self.changed:
            while self.used and self.used + size > self.budget:
                self.changed.wait()
            self.used += size
        future = pool.submit(task, data, *args)
        future.add_done_callback(lambda _: self._release(size))
        return future

    def _release(self, size: int) -> None:
        with self.changed:
            self.used -= size
            self.changed.notify_all()


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def _specs_then_gate(manifest: ArtifactManifest, held: dict[str, bytes], gate: Gate) -> list:
    return gate(manifest, specs_from_manifest(manifest, held.__getitem__), held.__getitem__)


__all__ = [
    "BundleMember",
    "MAX_MEMBERS",
    "ReceivedBundle",
    "UploadInterrupted",
    "member_path",
    "gated_digests",
    "read_bundle_stream",
    "receive_bundle",
    "too_large",
]
