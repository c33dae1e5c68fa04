"""How the `normbridge` process ends (cli.main.main): without Python's teardown, yet with everything an exit owes done.

Each test runs a real interpreter: the console script's `main`, with the command's app wrapped where a test needs to
register an atexit handler the way a command's imports do (converters/gate/split_check.py's worker reaper), or to crash.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from schemas.errors import EXIT_CODES, InputFileError

ROOT = Path(__file__).resolve().parents[2]

WRAPPED = """
import atexit, sys
import cli.main

def app():
    atexit.register(lambda: print("handler registered by the command ran", flush=True))
    {body}

cli.main.app_original, cli.main.app = cli.main.app, app
sys.argv = ["normbridge", *sys.argv[1:]]
cli.main.main()
"""


def run(body: str, *args: str) -> subprocess.CompletedProcess:
    script = WRAPPED.format(body=textwrap.indent(body, "    ").strip())
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_output_is_whole_and_handlers_registered_by_the_command_run():
    done = run("cli.main.app_original()", "--help")
    assert done.returncode == 0, done.stderr
    for command in ("register", "pull", "export", "inspect", "drift"):
        assert command in done.stdout
    assert done.stdout.rstrip().endswith("handler registered by the command ran")


def test_a_failing_command_keeps_its_exit_code_and_message(tmp_path):
    missing = tmp_path / "missing.pt2"
    done = run("cli.main.app_original()", "inspect", str(missing))
    assert done.returncode == EXIT_CODES[InputFileError], done.stdout + done.stderr
    assert str(missing) in done.stderr + done.stdout
    assert "handler registered by the command ran" in done.stdout


def test_a_message_exit_prints_the_message_and_exits_1():
    done = run("raise SystemExit('stopped: a message, not a number')")
    assert done.returncode == 1
    assert "stopped: a message, not a number" in done.stderr
    assert "handler registered by the command ran" in done.stdout


def test_a_crash_exits_as_python_does_with_its_traceback():
    done = run("raise RuntimeError('a bug, not a refusal')")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "RuntimeError: a bug, not a refusal" in done.stderr
    assert "handler registered by the command ran" in done.stdout


def test_the_modules_imported_before_the_command_runs_are_exempt_from_collections():
    """What cli.main imported is frozen before the command runs (a cold command's full collections skip it)."""
    done = run("import gc; print('frozen', gc.get_freeze_count())")
    assert done.returncode == 0, done.stderr
    frozen = int(done.stdout.split("frozen ")[1].split()[0])
    assert frozen > 10_000, done.stdout  # typer, rich, pydantic and the commands' modules


def test_the_console_script_runs_main():
    """pyproject's entry point is `main`, not the bare app (which would tear the interpreter down)."""
    text = (ROOT / "pyproject.toml").read_text()
    assert 'normbridge = "cli.main:main"' in text


def test_a_reader_that_closed_the_output_ends_the_command_with_141_and_no_message(tmp_path):
    """`normbridge schema | head -c 10`, `normbridge models | head -1`: the reader leaves, the command stops quietly
    with 128 + SIGPIPE as a Unix tool ends (was 1, this CLI's code for a crash). The pipe's read end is closed before it
    starts, so every write fails, the plain print of `schema` and the Rich table of `models` alike."""
    from cli.errors import OUTPUT_CLOSED_EXIT
    from tests.cli_process import normbridge_command

    for args in (["schema"], ["models", "--db", f"sqlite:///{tmp_path / 'r.db'}", "--blobs", str(tmp_path / "blobs")]):
        read, write = os.pipe()
        os.close(read)
        try:
            done = subprocess.run(
                [*normbridge_command(), *args], stdout=write, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=300
            )
        finally:
            os.close(write)
        assert done.returncode == OUTPUT_CLOSED_EXIT == 141, (args, done.returncode, done.stderr)
        assert done.stderr.strip() == "", done.stderr


def test_ctrl_c_during_a_command_says_what_stopped_and_leaves_no_version(tmp_path):
    """Ctrl-C while `register` reads the model (torch loaded: the command is past start-up) exits 130 with one line
    naming the command and what it left, and the registry holds no version (issue 35)."""
    import signal
    import time

    import torch
    from torch import nn

    from registry.service import Registry

    model = nn.Sequential(*[nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)) for _ in range(30)]).eval()
    pt2 = tmp_path / "deep.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 8, 16, 16),)), str(pt2))
    home = tmp_path / "home"
    env = {**os.environ, "NORMBRIDGE_HOME": str(home)}
    for name in ("NORMBRIDGE_SERVER", "NORMBRIDGE_TOKEN", "NORMBRIDGE_DB", "NORMBRIDGE_BLOBS"):
        env.pop(name, None)
    command = [sys.executable, "-c", "import cli.main; cli.main.main()", "register", "deep", str(pt2)]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while "libtorch" not in Path(f"/proc/{process.pid}/maps").read_text():  # the command itself has started
        assert process.poll() is None and time.monotonic() < deadline, (
            "the registration ended before it could be interrupted"
        )
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, out + err
    assert "interrupted: `normbridge register` stopped before it finished" in err and "Traceback" not in err
    if (home / "registry.db").exists():
        assert Registry(db=f"sqlite:///{home / 'registry.db'}", blobs=str(home / "blobs")).models() == []


SWALLOWED_STOP = """
import signal, sys, time, weakref
import cli.main

cli.main._install_stop_handlers()


class Thing:
    pass


def finalizer(ref):  # as SQLAlchemy's weakref callbacks run inside a garbage collection
    signal.raise_signal(signal.SIGINT if sys.argv[1] == "int" else signal.SIGTERM)
    for _ in range(1000):  # the handler runs here: its exception is printed as "Exception ignored" and dropped
        pass


thing = Thing()
ref = weakref.ref(thing, finalizer)
try:
    del thing
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the stop given again lands here
        time.sleep(0.01)
    print("went on")
except KeyboardInterrupt:
    print("interrupted", len(cli.main._INTERRUPTED))
except SystemExit as stop:
    print("terminated", stop.code)
"""


@pytest.mark.parametrize("signal_name, said", [("int", "interrupted 2"), ("term", "terminated 143")])
def test_a_stop_landing_in_a_finalizer_is_given_again_not_swallowed(signal_name, said):
    """Ctrl-C or SIGTERM whose handler ran inside a weakref callback (where Python prints "Exception ignored" and goes
    on) stops the command at its next instruction: a registration interrupted there had committed its version."""
    done = subprocess.run(
        [sys.executable, "-c", SWALLOWED_STOP, signal_name], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == said, done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr
