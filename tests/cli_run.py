"""Run `normbridge` as a user's shell would: a new process, the user's environment, a chosen umask and terminal width."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from tests.cli_process import normbridge_command

#: Variables the test process sets for itself (tests/conftest.py) that a user's shell does not have.
TEST_ONLY_VARIABLES = ("TF_CPP_MIN_LOG_LEVEL", "NORMBRIDGE_VERBOSE", "COLUMNS", "LINES", "NORMBRIDGE_FAULT")


def user_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ without what the test process added, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_VARIABLES}
    env.update(extra or {})
    return env


def run_cli(*args: str, cwd: Path, columns: int | None = None, umask: int | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """`normbridge ARGS` in `cwd`, stdout and stderr captured (not a terminal), COLUMNS and umask as given."""
    extra = dict(env or {})
    if columns is not None:
        extra["COLUMNS"] = str(columns)
    return subprocess.run(normbridge_command() + list(args), cwd=cwd, env=user_environment(extra), capture_output=True, text=True,
                          timeout=timeout, preexec_fn=None if umask is None else (lambda: os.umask(umask)), stdin=subprocess.DEVNULL)
