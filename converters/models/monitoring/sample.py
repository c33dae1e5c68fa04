"""The collector's traffic sample: the last N input rows of sampled requests, kept for `normbridge recalibrate`.

`monitor(..., keep_sample=N)` copies the inputs of each sampled request on the request thread (the caller may reuse
its buffers) and hands the copy to the collector's worker thread, which appends it here. The ring holds at most N
rows along the batch axis (the oldest rows go first), so its memory is N rows of each input plus one request.

`save(path)` writes an .npz that `normbridge recalibrate MODEL SAMPLE.npz` and `normbridge drift` read as they are: one
array per model input, in the order the model takes its inputs, batch axis first, the newest row last, each array named
after its input when the served object says (torch forward's argument names, whether passed by position or by keyword,
onnxruntime input names, Keras input names), else `input_0`, `input_1`, ...
The file is written atomically and read without unpickling.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from schemas import InputFileError


def copied_inputs(inputs: Any) -> tuple[np.ndarray, ...]:
    """Own copies of one request's inputs as NumPy arrays (torch tensors are detached and moved to the CPU first)."""
    out = []
    for value in inputs:
        if hasattr(value, "detach"):
            value = value.detach().cpu()
        out.append(np.array(value, copy=True))
    return tuple(out)


class TrafficSample:
    """A bounded ring of input rows; `add` runs on the collector's worker thread, `save` on the caller's."""

    def __init__(self, rows: int, names: list[str] | None = None):
        if rows < 1:
            raise InputFileError(
                f"keep_sample={rows} keeps nothing; pass the number of input rows to keep, e.g. keep_sample=512."
            )
        self.limit = int(rows)
        self.names = list(names) if names else None
        self._parts: deque[tuple[np.ndarray, ...]] = deque()
        self._rows = 0
        self.seen = 0  # rows offered since the start (kept or since pushed out)
        self._lock = threading.Lock()

    @property
    def rows(self) -> int:
        return self._rows

    def add(self, arrays: tuple[np.ndarray, ...], names: tuple[str, ...] | None = None) -> None:
        """Append one request's copied inputs (named by `names` when the served object says which inputs they are); the
        oldest rows beyond the limit are let go."""
        if not arrays or any(a.ndim == 0 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
            raise InputFileError(
                f"a sampled request's inputs have no common batch axis (shapes {[list(a.shape) for a in arrays]}); "
                "keep_sample needs batch-first array inputs."
            )
        rows = int(arrays[0].shape[0])
        if rows > self.limit:
            arrays, rows = tuple(a[-self.limit :].copy() for a in arrays), self.limit
        with self._lock:
            self._parts.append((arrays, names))
            self._rows += rows
            self.seen += int(arrays[0].shape[0])
            while self._rows > self.limit:
                extra, (oldest, oldest_names) = self._rows - self.limit, self._parts[0]
                head = int(oldest[0].shape[0])
                if head <= extra:
                    self._parts.popleft()
                    self._rows -= head
                else:  # keep the newest rows of the oldest request; a copy, so the dropped rows are freed
                    self._parts[0] = (tuple(a[extra:].copy() for a in oldest), oldest_names)
                    self._rows -= extra

    def arrays(self) -> dict[str, np.ndarray]:
        """The kept rows, one array per input (named), oldest row first."""
        with self._lock:
            parts = list(self._parts)
        if not parts:
            raise InputFileError(
                "the traffic sample is empty: no sampled request has been served since monitor(..., keep_sample=N) "
                "started (raise sample_rate or serve more requests first)."
            )
        given = {part_names for _, part_names in parts}
        if len(given) > 1:
            listed = sorted("(" + ", ".join(n or ["unnamed"]) + ")" for n in given)
            raise InputFileError(
                f"sampled requests passed different inputs ({'; '.join(listed)}); a recalibration sample needs every request "
                "to pass the same inputs: serve them with the same inputs, or save earlier."
            )
        count = len(parts[0][0])
        if any(len(arrays) != count for arrays, _ in parts):
            raise InputFileError(
                f"sampled requests had different numbers of inputs ({sorted({len(arrays) for arrays, _ in parts})}); "
                "a recalibration sample needs every request to pass the same inputs."
            )
        names = next(iter(given))
        if names is None:
            names = (
                self.names[:count] if self.names and len(self.names) >= count else [f"input_{i}" for i in range(count)]
            )
        out = {}
        for index, name in enumerate(names):
            shapes = {arrays[index].shape[1:] for arrays, _ in parts}
            if len(shapes) != 1:
                raise InputFileError(
                    f"input '{name}' came in shapes {sorted(list(s) for s in shapes)} (after the batch axis) in the kept requests; "
                    "a recalibration sample needs one shape per input: serve one shape, or save earlier."
                )
            out[name] = np.concatenate([arrays[index] for arrays, _ in parts])
        return out

    def save(self, path: str | Path) -> int:
        """Write the kept rows to `path` (.npz) atomically; returns the number of rows written."""
        path = Path(path)
        if path.suffix.lower() != ".npz":
            raise InputFileError(
                f"save_sample('{path}'): the sample is written as .npz (one array per input); use a path ending in .npz."
            )
        arrays = self.arrays()
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".npz", dir=path.parent)
        try:
            with os.fdopen(handle, "wb") as out:
                np.savez(out, **arrays)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return int(next(iter(arrays.values())).shape[0])


__all__ = ["TrafficSample", "copied_inputs"]
