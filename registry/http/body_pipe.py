"""A request body handed from the event loop to the thread that registers it, while it arrives.

The loop side `send`s chunks (a bounded queue: when it is full, the wait happens off the loop)
and `finish`es with an optional error (the client went away, the body passed the limit); the
thread side reads the pipe as a file. When the reader stops early (a refused bundle), the
remaining chunks are dropped, so the client can finish sending and then read the answer.
"""

from __future__ import annotations

import io
import threading
from collections import deque

from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from registry.bundle_stream import UploadInterrupted, too_large

from .uploads import DRAIN_BYTES

MAX_QUEUED = 16 << 20  # bytes waiting for the reader before the sender waits


class BodyPipe(io.RawIOBase):
    """A bounded queue of body chunks with a file interface on the reading side (chunks are handed over, not copied)."""

    def __init__(self, max_queued: int = MAX_QUEUED):
        super().__init__()
        self._chunks: deque[bytes] = deque()
        self._queued = 0
        self._max = max_queued
        self._ready = threading.Condition()
        self._ended = False
        self._error: BaseException | None = None
        self._abandoned = False

    # -- the event loop's side

    def has_room(self) -> bool:
        with self._ready:
            return self._abandoned or self._queued < self._max

    def put(self, chunk: bytes) -> None:
        """Queue a chunk, waiting while the queue is full; dropped once the reader has stopped."""
        with self._ready:
            while not self._abandoned and self._queued >= self._max:
                self._ready.wait()
            if not self._abandoned:
                self._chunks.append(chunk)
                self._queued += len(chunk)
                self._ready.notify_all()

    def finish(self, error: BaseException | None = None) -> None:
        """No more chunks; the reader gets `error` (if any) once it has read what was queued."""
        with self._ready:
            if not self._ended:
                self._ended, self._error = True, error
            self._ready.notify_all()

    # -- the reading thread's side

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        with self._ready:
            while not self._chunks and not self._ended:
                self._ready.wait()
            if not self._chunks:
                if self._error is not None:
                    raise self._error
                return b""
            head = self._chunks[0]
            if size < 0 or size >= len(head):  # fewer bytes than asked is fine for a raw stream; tarfile reads on
                piece = self._chunks.popleft()
            else:
                piece, self._chunks[0] = head[:size], head[size:]
            self._queued -= len(piece)
            self._ready.notify_all()
            return piece

    def abandon(self) -> None:
        """The reader is done (or gave up): drop what is queued and whatever is still sent."""
        with self._ready:
            self._abandoned = True
            self._chunks.clear()
            self._queued = 0
            self._ready.notify_all()


async def send_body(request: Request, pipe: BodyPipe, limit: int) -> None:
    """Feed the request body into `pipe` as it arrives, then finish it (with the reason, if it stopped early).

    The caller has already refused a declared Content-Length over the limit (uploads.refuse_declared_excess); a body
    without one is counted here, and the reader, which reads the pipe to its end before registering, gets the 413."""
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit + DRAIN_BYTES:
                break
            if received > limit:
                continue  # read and dropped, so the client sees the 413 rather than a reset connection
            if chunk:
                await _put(pipe, chunk)
    except ClientDisconnect:
        pipe.finish(
            UploadInterrupted(
                f"the client disconnected after {received} bytes; nothing was registered, send the whole file again."
            )
        )
        return
    if received > limit:
        pipe.finish(too_large(limit))
        return
    pipe.finish()


async def _put(pipe: BodyPipe, chunk: bytes) -> None:
    if pipe.has_room():
        pipe.put(chunk)
    else:
        await run_in_threadpool(pipe.put, chunk)


__all__ = ["BodyPipe", "send_body"]
