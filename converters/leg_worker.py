"""A worker process that runs `check` on the frameworks it is asked for, so the caller need not import them.

Why: a registration of a .pt2 checks every normalizer on Keras too, and importing TensorFlow costs
about 4 s, more than reading the model. A worker started when the registration starts imports it
while the caller reads the model and runs its own legs (converters/split_check.py). The worker runs
`converters.check` on the same spec, keeping the objects it built for later specs of the same
configuration (grouped_check.checker_for: the results are check's, field for field): the spec
travels as its JSON document and safetensors bytes (schemas/spec_io.py, bit-exact, nothing executed on reading), the
result comes back as the CheckResult's fields in JSON (infinities included), an error as its
NormbridgeError class, message, layer and setting.

Frames on the pipes are an 8-byte big-endian length and that many bytes: a request is two frames
(header JSON, tensor bytes), a reply one. `python -m converters.leg_worker PACKAGES torch keras` builds
the caller's AdapterRegistry from PACKAGES (JSON), imports the named frameworks at once, then serves
until its input closes.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import BinaryIO

from schemas import CheckResult, NormSpec, NormbridgeError
from schemas import errors as error_types
from schemas.spec_io import spec_from_parts, spec_to_json, tensors_to_bytes

from .adapters import AdapterRegistry
from .grouped_check import checker_for

_LENGTH = struct.Struct(">Q")
#: The folder holding the `converters` package, put first on the worker's path (it runs this copy of normbridge).
_ROOT = str(Path(__file__).resolve().parent.parent)


def _write_frame(stream: BinaryIO, payload: bytes) -> None:
    stream.write(_LENGTH.pack(len(payload)))
    stream.write(payload)


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(stream: BinaryIO) -> bytes | None:
    head = _read_exactly(stream, _LENGTH.size)
    return None if head is None else _read_exactly(stream, _LENGTH.unpack(head)[0])


def _error_from(fields: dict) -> Exception:
    """The worker's error as the caller would have seen it in process: its NormbridgeError class when it had one."""
    classes = {cls.code: cls for cls in vars(error_types).values() if isinstance(cls, type) and issubclass(cls, NormbridgeError)}
    cls = classes.get(fields.get("code"))
    if cls is None:
        return RuntimeError(f"the check's worker process failed: {fields['type']}: {fields['message']}")
    error = cls.__new__(cls)
    Exception.__init__(error, fields["message"])
    error.message, error.layer, error.setting = fields["message"], fields.get("layer"), fields.get("setting")
    return error


class LegWorker:
    """One worker process and the checks in flight on it; requests are answered in the order they were sent."""

    def __init__(self, warm: list[str], packages: dict[str, str]):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self._stderr = tempfile.TemporaryFile()
        self._process = subprocess.Popen([sys.executable, "-m", "converters.leg_worker", json.dumps(packages), *warm], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        self._lock = threading.Lock()
        self._pending: list[Future] = []
        self._reader = threading.Thread(target=self._read_replies, name="normbridge-leg-worker", daemon=True)
        self._reader.start()

    def submit(self, spec: NormSpec, frameworks: list[str]) -> Future:
        """A future CheckResult of `check(spec, frameworks)` run in the worker."""
        header = json.dumps({"frameworks": frameworks, "spec": json.loads(spec_to_json(spec))}).encode()
        future: Future = Future()
        with self._lock:
            self._pending.append(future)
            try:
                _write_frame(self._process.stdin, header)
                _write_frame(self._process.stdin, tensors_to_bytes(spec))
                self._process.stdin.flush()
            except OSError:
                pass  # the worker is gone: the reader fails every pending check with its last words
        return future

    def _read_replies(self) -> None:
        while True:
            reply = _read_frame(self._process.stdout)
            with self._lock:
                if reply is None:
                    pending, self._pending = self._pending, []
                    break
                future = self._pending.pop(0)
            fields = json.loads(reply)
            if "error" in fields:
                future.set_exception(_error_from(fields["error"]))
            else:
                future.set_result(CheckResult.model_validate(fields["result"]))
        error = RuntimeError(f"the check's worker process ended (exit code {self._process.wait()}): {self._last_words()}")
        for future in pending:
            future.set_exception(error)

    def _last_words(self) -> str:
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "it printed nothing"

    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        """End the worker now and reap it: it holds no state worth a graceful exit, and one still importing TensorFlow
        (a registration that failed before its gate) would otherwise keep its caller waiting seconds at exit."""
        try:
            self._process.stdin.close()
        except OSError:
            pass
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()


def _serve(requests: BinaryIO, replies: BinaryIO, registry: AdapterRegistry) -> None:
    while (header := _read_frame(requests)) is not None:
        tensors = _read_frame(requests)
        try:
            request = json.loads(header)
            result = checker_for(registry).check(spec_from_parts(request["spec"], tensors), frameworks=request["frameworks"])
            reply = {"result": result.model_dump(mode="python")}
        except Exception as error:  # every error goes back to the caller, which raises it there
            reply = {"error": {"type": type(error).__name__, "message": str(error), "code": getattr(error, "code", None),
                               "layer": getattr(error, "layer", None), "setting": getattr(error, "setting", None)}}
        _write_frame(replies, json.dumps(reply).encode())
        replies.flush()


def main(argv: list[str]) -> None:
    """argv: the caller's adapter packages (JSON: AdapterRegistry.packages), then the frameworks to import at once."""
    registry = AdapterRegistry(json.loads(argv[0]))
    for name in argv[1:]:
        registry.framework(name).version()  # imports the framework now, while the caller reads its model
    _serve(sys.stdin.buffer, sys.stdout.buffer, registry)
    sys.stdout.flush()
    os._exit(0)  # TensorFlow's teardown takes seconds and nobody waits for it


if __name__ == "__main__":
    main(sys.argv[1:])
