"""A version's tensors for a writer: each blob read (and re-hashed as it streams in) ahead of its turn, several at once.

`pull` writes a model file entry by entry; each entry's tensor is a blob in the store. Reading them one after the
other would leave the network idle while the file is written and the disk idle while a blob arrives, so the blobs
are read by a pool in the order the writer will ask for them (ModelAdapter.tensor_order), at most READ_AHEAD bytes
ahead of it, and a blob's bytes are let go once every tensor it holds has been handed out. Each tensor is a
read-only view of its blob's bytes, checked against its manifest entry from the blob's header (no decode, no copy).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from schemas.manifest import ArtifactManifest

from ..tensor_blobs import tensor_view

#: Bytes of blobs read ahead of the writer (the memory a pull holds beyond the entry being written).
READ_AHEAD = 256 << 20
#: progress(step, done, total), as registration reports it.
Progress = Callable[[str, int, int], None]


class FetchedTensors(Mapping):
    """The tensors of `manifest` by name, read through `get(digest)` (which re-hashes) by `pool` ahead of the writer in
    `order` (names; empty: every tensor, sorted). A name asked out of turn is read at once, as is one asked again after
    its blob was let go."""

    def __init__(
        self,
        manifest: ArtifactManifest,
        get: Callable[[str], bytes],
        pool: ThreadPoolExecutor,
        order: Iterable[str],
        report: Progress | None = None,
    ):
        self.refs, self.read, self.pool = manifest.tensors, get, pool
        self.report = report or (lambda step, done, total: None)
        names = list(dict.fromkeys(n for n in order if n in self.refs)) or sorted(self.refs)
        self.queue = list(dict.fromkeys(self.refs[n].digest for n in names))
        self.uses: dict[str, int] = {}  # tensors of each blob in the order not handed out yet
        for name in names:
            self.uses[self.refs[name].digest] = self.uses.get(self.refs[name].digest, 0) + 1
        self.sizes = {self.refs[n].digest: self.refs[n].nbytes for n in names}
        self.futures: dict[str, Future] = {}
        self.released: set[str] = set()
        self.next = self.ahead = self.handed = 0
        self.lock = threading.Lock()
        self._read_ahead()

    def _read_ahead(self) -> None:
        """Submit blobs in order while less than READ_AHEAD bytes wait for the writer (always at least one)."""
        with self.lock:
            while self.next < len(self.queue) and (self.ahead < READ_AHEAD or not self.futures):
                digest = self.queue[self.next]
                self.next += 1
                if digest not in self.futures and digest not in self.released:
                    self.futures[digest] = self.pool.submit(self.read, digest)
                    self.ahead += self.sizes[digest]

    def __getitem__(self, name: str) -> np.ndarray:
        ref = self.refs[name]
        with self.lock:
            future = self.futures.get(ref.digest)
            if future is None:  # asked out of turn, or again after its bytes were let go: read now
                future = self.futures[ref.digest] = self.pool.submit(self.read, ref.digest)
                self.ahead += ref.nbytes
        tensor = tensor_view(future.result(), ref, name)
        with self.lock:
            self.handed += 1
            self.uses[ref.digest] = self.uses.get(ref.digest, 1) - 1
            if (
                self.uses[ref.digest] <= 0 and self.futures.pop(ref.digest, None) is not None
            ):  # every tensor it holds was handed out
                self.ahead -= ref.nbytes
                self.released.add(ref.digest)
        self.report("reading blobs", min(self.handed, len(self.refs)), len(self.refs))
        self._read_ahead()
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self.refs)

    def __contains__(self, name: object) -> bool:  # Mapping's default would read the tensor
        return name in self.refs

    def __len__(self) -> int:
        return len(self.refs)


__all__ = ["FetchedTensors", "READ_AHEAD"]
