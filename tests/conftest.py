"""Shared test setup: quiet TensorFlow, bounded hypothesis profiles, absl's log stream,
the spec factory as a fixture."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# CLI runs get a private gate worker each (tests/converters/gate/test_shared_worker.py starts shared ones in their own
# folders): a shared worker would outlive the test that started it.
os.environ.setdefault("NORMBRIDGE_GATE_WORKER", "private")

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("thorough", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


import pytest  # noqa: E402

from converters.native_order import prepare as _prepare_native_order  # noqa: E402

_prepare_native_order()  # triton's native library before any test imports TensorFlow (converters/native_order.py)

# autouse
from tests.process_limits import _bounded_test_process, _no_shared_worker_outlives_the_session  # noqa: E402,F401


class _CurrentStderr:
    """A stream writing to whatever `sys.stderr` is at the time of each write; closing it closes nothing."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def close(self) -> None:
        pass


def _absl_handler_holds_no_capture_stream() -> None:
    """absl's Python log handler, created when absl.logging is first imported (TensorFlow imports it), keeps the stream
    that was `sys.stderr` then: in a test process, pytest's capture file of fd 2, shared by every later test. Its
    close() closes that stream unless it is the `sys.stderr` of the moment, and MLflow 3.11's `import mlflow` closes
    every log handler of the process (`logging.config.dictConfig`). So a test importing TensorFlow, then a later one
    importing MLflow inside a CliRunner run (`normbridge mlflow push`, where `sys.stderr` is the runner's), closed
    pytest's capture: "I/O operation on closed file" in that test and in every later one on the same worker. absl's
    handler writes to the current `sys.stderr` instead (each test's capture),
    through a stream its close() cannot close."""
    try:
        import absl.logging
    except ImportError:  # no absl, no such handler
        return
    absl.logging.get_absl_handler().python_handler.setStream(_CurrentStderr())


_absl_handler_holds_no_capture_stream()


@pytest.fixture
def cli_app():
    """The `normbridge` Typer app with every command module registered (cli/main.py lists them)."""
    from cli.main import app

    return app
