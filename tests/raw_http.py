"""HTTP/1.1 over a plain socket, for the requests an attacker makes and httpx does not: a huge body streamed while the
answer is watched for (the sender stops as soon as the server answers), and a download whose body is never read.

Both speak to a real server on loopback; the answer is parsed by the standard library's http.client.
"""

from __future__ import annotations

import http.client
import select
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Answer", "open_unread", "stream_body"]


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    sent: int  # body bytes the server took before it answered (or all of them)


def _connect(url: str, timeout: float) -> tuple[socket.socket, str]:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=timeout), parts.netloc


def _head(method: str, path: str, netloc: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {netloc}", *(f"{name}: {value}" for name, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def stream_body(
    url: str,
    method: str,
    path: str,
    headers: dict[str, str],
    total: int,
    *,
    chunked: bool,
    piece: int = 1 << 20,
    timeout: float = 120.0,
) -> Answer:
    """Send `total` zero bytes as the body of `method path` (declared with Content-Length, or chunked), stopping as soon
    as the server answers or stops reading; then read the answer."""
    sock, netloc = _connect(url, timeout)
    try:
        framing = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(total)}
        sock.sendall(_head(method, path, netloc, {**headers, **framing}))
        sock.setblocking(False)
        zeros, queued, pending, answered = bytes(piece), 0, memoryview(b""), False
        deadline = time.monotonic() + timeout
        while not answered and (queued < total or pending or chunked):
            if not pending:
                if queued >= total:  # everything sent: end a chunked body
                    pending, chunked = memoryview(b"0\r\n\r\n"), False
                else:
                    size = min(piece, total - queued)
                    queued += size
                    data = zeros[:size]
                    pending = memoryview(f"{size:x}\r\n".encode() + data + b"\r\n" if chunked else data)
            readable, writable, _ = select.select([sock], [sock], [], max(0.0, deadline - time.monotonic()))
            if readable:
                answered = True
            elif writable:
                try:
                    pending = pending[sock.send(pending) :]
                except (BrokenPipeError, ConnectionResetError):
                    answered = True
            elif time.monotonic() > deadline:
                raise TimeoutError(f"{method} {path}: the server neither read the body nor answered within {timeout} s")
        sock.setblocking(True)
        sock.settimeout(timeout)
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read(), queued)
    finally:
        sock.close()


def open_unread(
    url: str, path: str, headers: dict[str, str], timeout: float = 120.0
) -> tuple[socket.socket, int, dict[str, str]]:
    """GET `path` and read only the answer's status line and headers: the body is left unread, the socket open
    (close it).

    The kernel's receive buffer fills and the server's sends stall, as with a client that stopped reading."""
    sock, netloc = _connect(url, timeout)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.sendall(_head("GET", path, netloc, headers))
    response = http.client.HTTPResponse(sock, method="GET")
    response.begin()  # reads the head through a small buffer, never the body
    return sock, response.status, {k.lower(): v for k, v in response.getheaders()}
