"""Run `normbridge` as a user's shell would: a new process, the user's environment, a chosen umask and terminal width.

`invoke_cli` runs the same command in this process through Typer's CliRunner (the console script is
`cli.main:app`, so the same parsing, command and error mapping run, without 5-20 s of interpreter and
framework start-up). Test files keep a real process for the behaviours a process adds (exit status,
file descriptors, start-up) and use `invoke_cli` for the rows that only vary the arguments.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from typer.testing import CliRunner

from tests.cli_process import normbridge_command

#: Variables the test process sets for itself (tests/conftest.py) that a user's shell does not have.
TEST_ONLY_VARIABLES = ("TF_CPP_MIN_LOG_LEVEL", "NORMBRIDGE_VERBOSE", "COLUMNS", "LINES", "NORMBRIDGE_FAULT")
#: What Rich measures for a pipe when COLUMNS is unset: the width a captured process prints at.
PIPE_COLUMNS = 80


def user_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ without what the test process added, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_VARIABLES}
    env.update(extra or {})
    return env


def run_cli(
    *args: str,
    cwd: Path,
    columns: int | None = None,
    umask: int | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """`normbridge ARGS` in `cwd`, stdout and stderr captured (not a terminal), COLUMNS and umask as given."""
    extra = dict(env or {})
    if columns is not None:
        extra["COLUMNS"] = str(columns)
    return subprocess.run(
        normbridge_command() + list(args),
        cwd=cwd,
        env=user_environment(extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=None if umask is None else (lambda: os.umask(umask)),
        stdin=subprocess.DEVNULL,
    )


def invoke_cli(
    *args: str, cwd: Path, columns: int | None = None, umask: int | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`normbridge ARGS` run in this process as `run_cli` runs it: in `cwd`, under `umask`, at `columns`
    (80 like a pipe)."""
    from cli.main import app  # the console script's object; imported late so collecting a test file stays cheap

    overrides: dict[str, str | None] = {name: None for name in TEST_ONLY_VARIABLES if name != "TF_CPP_MIN_LOG_LEVEL"}
    overrides.update(env or {})
    overrides["COLUMNS"] = str(columns or PIPE_COLUMNS)
    previous_cwd, previous_umask = os.getcwd(), None
    os.chdir(cwd)
    if umask is not None:
        previous_umask = os.umask(umask)
    try:
        result = CliRunner().invoke(app, list(args), env=overrides, catch_exceptions=False)
    finally:
        if previous_umask is not None:
            os.umask(previous_umask)
        os.chdir(previous_cwd)
    return subprocess.CompletedProcess(["normbridge", *args], result.exit_code, result.stdout, result.stderr)


#: Runs its arguments as a child and prints the child's exit code, output and peak resident memory
#: (bytes; Linux reports KiB).
_MEASURING_LAUNCHER = (
    "import json, resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True, stdin=subprocess.DEVNULL)\n"
    "print(json.dumps({'rc': done.returncode, 'stdout': done.stdout, 'stderr': done.stderr,"
    " 'peak_rss': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))\n"
)


def run_cli_measured(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 600
) -> tuple[subprocess.CompletedProcess, int]:
    """`run_cli`, plus the command's peak resident memory in bytes. It is started by a small launcher process, not by
    the test process: Linux counts in a child's ru_maxrss the peak of the image it was forked from,
    here the test process."""
    import json
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _MEASURING_LAUNCHER, *normbridge_command(), *args],
        cwd=cwd,
        env=user_environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    measured = json.loads(done.stdout)
    return subprocess.CompletedProcess(
        ["normbridge", *args], measured["rc"], measured["stdout"], measured["stderr"]
    ), measured["peak_rss"]
