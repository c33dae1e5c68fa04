"""Keep the frameworks' own chatter off stderr unless `--verbose`, so what is left there is normbridge's.

Successful runs printed TensorFlow's oneDNN and absl start-up lines (twice: once per shared library),
torch.onnx's "torchvision is not installed" on every `.pt2` export, FutureWarnings from framework
internals and tf2onnx's tracebacks of optimizer passes it recovered from. None of it is about the
user's model; normbridge's own warnings (hazards, report warnings, contract findings) are printed
by the commands and are untouched. Each kind of noise is silenced where it comes from:

* TF_CPP_MIN_LOG_LEVEL=2 (unless the user set it), read by TensorFlow's C++ logging when it loads.
  Not TF_ENABLE_ONEDNN_OPTS=0: that switches kernels, hence changes the numbers.
* A few lines are printed from C++ before TensorFlow's logging reads that variable (the oneDNN
  notice, absl's "before absl::InitializeLog()" line, the CPU-instructions notice). While `tensorflow`
  is first imported, file descriptor 2 goes to a temporary file; afterwards the lines matching
  STARTUP_NOISE are dropped and everything else is written to stderr. Python's own writes during
  the import (a spinner, a warning) go straight to the terminal meanwhile.
* The frameworks' Python loggers are set to ERROR: tf2onnx, onnxscript and tensorflow right away,
  torch.onnx and absl once torch and tensorflow are imported (torch resets its loggers' levels when
  it loads, and absl installs its own logger class, so neither can be set before).
* FutureWarning, DeprecationWarning and PendingDeprecationWarning are ignored: they address the
  frameworks' API callers (normbridge's developers), never a model.
* MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false (unless the user set it): MLflow's tqdm bars ("Downloading
  artifacts") filled `normbridge mlflow import|push` output; MLflow reads the variable at each transfer.

`--verbose` (or NORMBRIDGE_VERBOSE=1) installs none of it and sets TF_CPP_MIN_LOG_LEVEL=0 when unset
(the Keras adapter would otherwise default it to 2), so every framework line comes back.
"""

from __future__ import annotations

import importlib.abc
import io
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: C++ lines TensorFlow prints while it loads, before its log level applies (and GPU builds' duplicate-plugin errors).
STARTUP_NOISE = tuple(
    re.compile(pattern)
    for pattern in (
        rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
        rb"^I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] ",  # absl INFO lines (oneDNN, CPU features); before absl's init the time reads 00:00:<epoch seconds>
        rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: I \S+:\d+\] ",  # the same in TensorFlow's older log format
        rb"^To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.$",
        rb"Unable to register cu(DNN|FFT|BLAS) factory: Attempting to register factory for plugin",
        rb"computation placer already registered",
        rb"TF-TRT Warning: Could not find TensorRT",
    )
)
#: Loggers quiet from the start: plain `logging` loggers their packages never reconfigure.
QUIET_LOGGERS = ("tf2onnx", "onnxscript", "tensorflow")
#: Loggers quiet once their package is imported, keyed by that package.
QUIET_AFTER_IMPORT = {"torch": ("torch.onnx", "torch._export", "torch.export"), "tensorflow": ("absl",)}
FRAMEWORK_WARNINGS = (FutureWarning, DeprecationWarning, PendingDeprecationWarning)
VERBOSE_ENV = "NORMBRIDGE_VERBOSE"
#: MLflow's switch for its artifact transfer progress bars.
MLFLOW_PROGRESS_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


def configure(verbose: bool) -> None:
    """Quiet the frameworks for this process (idempotent); with `verbose`, let TensorFlow log at every level."""
    if verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault(MLFLOW_PROGRESS_ENV, "false")
    for category in FRAMEWORK_WARNINGS:
        warnings.filterwarnings("ignore", category=category)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for package in QUIET_AFTER_IMPORT:
        if package in sys.modules:
            _quiet_loggers_of(package)
    if not any(isinstance(finder, _QuietImports) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietImports())


def _quiet_loggers_of(package: str) -> None:
    for name in QUIET_AFTER_IMPORT.get(package, ()):
        if name == "absl" and "absl.logging" not in sys.modules:
            continue  # absl.logging sets its own logger class on first import: never create its logger before that
        logging.getLogger(name).setLevel(logging.ERROR)


def without_startup_noise(captured: bytes) -> bytes:
    """`captured` without the lines STARTUP_NOISE matches (everything else kept, in order)."""
    lines = captured.splitlines(keepends=True)
    return b"".join(line for line in lines if not any(p.search(line.rstrip(b"\r\n")) for p in STARTUP_NOISE))


class _QuietImports(importlib.abc.MetaPathFinder):
    """Runs the first import of torch and tensorflow through `_QuietLoader`; finds nothing itself."""

    def find_spec(self, name, path=None, target=None):
        if name not in QUIET_AFTER_IMPORT:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _QuietLoader(spec.loader, name)
                return spec
        return None


class _QuietLoader(importlib.abc.Loader):
    """Executes a package's real loader (C++ start-up lines dropped for tensorflow), quiets its loggers,
    then steps aside."""

    def __init__(self, loader, package: str):
        self.loader, self.package = loader, package

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        guard = _startup_lines_dropped if self.package == "tensorflow" else _unchanged
        try:
            with guard():
                self.loader.exec_module(module)
        finally:
            module.__loader__ = self.loader  # the package sees its own loader from now on
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self.loader
        _quiet_loggers_of(self.package)

    def __getattr__(self, name: str):
        return getattr(self.loader, name)


@contextmanager
def _unchanged() -> Iterator[None]:
    yield


_terminal_stderr: list[
    io.TextIOWrapper
] = []  # one duplicate of the real fd 2 for the whole process (never closed: threads may hold it)


def _direct_stderr(current) -> io.TextIOBase | None:
    """A text stream on a duplicate of the original fd 2, standing in for sys.stderr while fd 2 is captured."""
    try:
        if current.fileno() != 2:
            return None
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return None
    if not _terminal_stderr:
        duplicate = os.dup(2)
        _terminal_stderr.append(
            io.TextIOWrapper(
                os.fdopen(duplicate, "wb", buffering=0, closefd=False),
                encoding=getattr(current, "encoding", None) or "utf-8",
                errors=getattr(current, "errors", None) or "backslashreplace",
                line_buffering=True,
                write_through=True,
            )
        )
    return _terminal_stderr[0]


@contextmanager
def _startup_lines_dropped() -> Iterator[None]:
    """fd 2 to a temporary file during the block; then the captured bytes, minus STARTUP_NOISE, to the real fd 2."""
    current = sys.stderr
    try:
        current.flush()
        saved = os.dup(2)
    except (AttributeError, ValueError, OSError):
        yield
        return
    replacement = _direct_stderr(current)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        if replacement is not None:
            sys.stderr = replacement
        try:
            yield
        finally:
            if replacement is not None:
                sys.stderr = current
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            _write_all(2, without_startup_noise(capture.read()))


def _write_all(fd: int, data: bytes, write: Callable[[int, bytes], int] = os.write) -> None:
    while data:
        data = data[write(fd, data) :]


__all__ = ["MLFLOW_PROGRESS_ENV", "STARTUP_NOISE", "VERBOSE_ENV", "configure", "without_startup_noise"]
