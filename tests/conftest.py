"""Shared test setup: quiet TensorFlow, bounded hypothesis profiles, the spec factory as a fixture."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# CLI runs get a private gate worker each (tests/converters/gate/test_shared_worker.py starts shared ones in their own folders):
# a shared worker would outlive the test that started it.
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

from tests.process_limits import _bounded_test_process, _no_shared_worker_outlives_the_session  # noqa: E402,F401  (autouse)


@pytest.fixture
def cli_app():
    """The `normbridge` Typer app with every command module registered (cli/main.py lists them)."""
    from cli.main import app

    return app
