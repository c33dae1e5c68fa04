"""A checkpoint folder's tensors staged while the registration is still reading the model: one pass over every byte.

Registering a Hugging Face checkpoint folder spends seconds importing torch and transformers and building the model
on the meta device (converters/torch_adapter/checkpoint_folder), none of which the tensors' blobs depend on: each blob
is a tensor's byte range (from the safetensors headers, read as JSON) behind the header `streamed_blobs.blob_header`
writes. So, on a store that can write a blob before its digest is known (`BlobStore.stages_unnamed`: a local folder),
a thread checks the folder as the reader does (folder_checks, safetensors_index: no torch) and streams every range into
the store's hidden staging files, hashing each on the way (`stage_chunks`: file reads, writes and hashlib hand the GIL
back), while the main thread imports. The extraction then takes each tensor's digest from here (`digest_of`) instead of
reading it again, and staging takes the staged file (`take`) instead of reading it a third time.

Nothing here is visible before the registration publishes: the staged files are the hidden ones staging writes anyway,
`close` stops the thread and removes every file not taken (a refused folder leaves none), and a crashed process's are
removed by gc after its grace period. Any error here (a folder the reader refuses, a full disk, a file changing) stops
the early staging and leaves the rest to the ordinary path, which reports it. A normalization's tensor (what the gate
checks) is hashed again from the file as before (registry/artifact.py), so a file changed since it was staged here
makes a digest this has not staged, which the ordinary path stages.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from converters.tensor_bytes import FileRangeBytes
from converters.torch_adapter.checkpoint_folder.folder_checks import CONFIG, check_folder
from converters.torch_adapter.checkpoint_folder.safetensors_index import checked_tensors
from schemas.safetensors_io import SAFETENSORS_DTYPES

from .blobs.base import BlobStore, StagedBlob
from .manifest_io import MANIFEST_FILE
from .streamed_blobs import TensorBlob, blob_header


class EarlyStaging:
    """The blobs of the checkpoint folder at `folder`, staged into `store` by a thread started at once."""

    def __init__(self, folder: Path, store: BlobStore):
        self.folder, self.store = folder, store
        self._digests: dict[tuple, str] = {}  # (file, start, length, blob header) -> digest
        self._staged: dict[str, StagedBlob] = {}  # digest -> its staged file, until taken
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="normbridge-early-staging", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, model: Any, store: BlobStore) -> EarlyStaging | None:
        """Early staging of `model` when it is a checkpoint folder (a folder with a config.json) and `store` writes
        blobs before their digest is known; else None."""
        if not (store.stages_unnamed and isinstance(model, (str, Path))):
            return None
        folder = Path(model)
        if not (folder / CONFIG).is_file() or (folder / MANIFEST_FILE).exists():
            return None
        return cls(folder, store)

    def _run(self) -> None:
        try:
            entries = sorted(checked_tensors(check_folder(self.folder)).values(), key=lambda e: (str(e.file), e.start))
            for entry in entries:
                name = SAFETENSORS_DTYPES.get(entry.dtype)
                if self._stop.is_set():
                    return
                if name is None:
                    continue  # a dtype the registry does not store: the extraction refuses it
                header = blob_header(name, list(entry.shape), entry.length)
                source = FileRangeBytes(entry.file, entry.start, entry.length)
                staged = self.store.stage_chunks(self._chunks(header, source), sync=False)
                if staged.digest in self._staged:  # the same bytes twice: one file
                    self.store.discard(staged)
                else:
                    self._staged[staged.digest] = staged
                self._digests[(str(entry.file), entry.start, entry.length, header)] = staged.digest
        except Exception:  # noqa: BLE001 - the ordinary path reads the folder again and reports what is wrong with it
            return

    def _chunks(self, header: bytes, source):
        yield header
        for chunk in source.chunks():
            if self._stop.is_set():
                raise InterruptedError("early staging stopped")
            yield chunk

    def digest_of(self, blob: TensorBlob) -> str | None:
        """The digest of `blob` when it is a byte range staged here (waiting for the thread to finish), else None."""
        source = blob.source
        if not isinstance(source, FileRangeBytes):
            return None
        self._thread.join()
        return self._digests.get((str(source.file), source.start, source.length, blob.header))

    def take(self, digest: str) -> StagedBlob | None:
        """The staged blob of `digest`, now the caller's to publish or discard; None when not staged here, when its file
        is gone (gc removes a staging file older than its grace period that no lease protects yet), or when the store
        held the blob already: that was seen before the registration's lease, so gc may have removed it since, and the
        ordinary path looks again under the lease."""
        self._thread.join()
        staged = self._staged.pop(digest, None)
        if staged is not None and (staged.temporary is None or not staged.temporary.exists()):
            return None
        return staged

    def close(self) -> None:
        """Stop the thread and remove every staged file not taken."""
        self._stop.set()
        self._thread.join()
        for staged in self._staged.values():
            self.store.discard(staged)
        self._staged.clear()


__all__ = ["EarlyStaging"]
