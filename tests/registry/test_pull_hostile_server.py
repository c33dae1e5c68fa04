"""`normbridge --server URL pull` against a hostile server: its headers never choose where the file goes.

Issue 30, hole 7: a server (hostile, or a man in the middle) answered GET .../model with
`X-Normbridge-Version: ../../../../escaped@1`, and `pull x@1 -o dl/` wrote escaped-1.onnx four folders above dl/ (then
exited 2). Here a small HTTP server on loopback (a real socket, http.server in a thread) sends well-formed answers with
the right digest and a lying version or format header; the real CLI, in its own process, must refuse each with a
one-line error and a non-zero exit, and write nothing anywhere.
"""

from __future__ import annotations

import hashlib
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cli_run import run_cli

pytestmark = pytest.mark.slow  # runs the CLI in a process

BODY = b"not really a model, but its digest is right"


@contextmanager
def hostile_server(version: str, fmt: str = "onnx"):
    """A server answering every GET with BODY, its true sha256, and the given version and format headers."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            for name, value in (
                ("Content-Type", "application/octet-stream"),
                ("Content-Length", str(len(BODY))),
                ("X-Normbridge-Version", version),
                ("X-Normbridge-Format", fmt),
                ("X-Normbridge-Digest", hashlib.sha256(BODY).hexdigest()),
            ):
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(BODY)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize(
    "version, fmt, ref, says",
    [
        ("../../../../escaped@1", "onnx", "x@1", "'../../../../escaped@1'"),  # the attack
        ("x@1/../../../../escaped@1", "onnx", "x@1", "x@1/../"),
        ("escaped@1", "onnx", "x@1", "'escaped@1'"),  # another model's name is another file name
        ("x@2", "onnx", "x@1", "not x@1"),  # another version than the one asked for
        ("../x@1", "onnx", "x@prod", "not a version of x"),
        ("x@1", "../../../onnx", "x@1", "format"),  # the suffix comes from the format header
    ],
    ids=["dot-dot", "slash-after", "other-model", "other-number", "alias", "format"],
)
def test_a_header_that_does_not_name_the_version_asked_for_writes_nothing(tmp_path, version, fmt, ref, says):
    dl = tmp_path / "a" / "b" / "c" / "d" / "dl"
    dl.mkdir(parents=True)
    with hostile_server(version, fmt) as url:
        done = run_cli("--server", url, "pull", ref, "-o", f"{dl}/", cwd=tmp_path)
    assert done.returncode == 12, (done.returncode, done.stdout, done.stderr)
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert says in message and "nothing was used or written" in message, message
    assert files_under(tmp_path) == [], files_under(tmp_path)


def test_an_honest_answer_is_written_under_the_version_it_names(tmp_path):
    with hostile_server("x@3") as url:
        done = run_cli("--server", url, "pull", "x@prod", "-o", "dl/", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert files_under(tmp_path) == ["dl/x-3.onnx"] and (tmp_path / "dl" / "x-3.onnx").read_bytes() == BODY
