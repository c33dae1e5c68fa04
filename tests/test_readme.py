"""The README's install and quickstart work as written (issue 16, item 14).

After `make demo` (which runs examples/quickstart.py), the README has the reader activate `.venv` and
type its `normbridge` lines. Here: `normbridge` is found on PATH once `.venv/bin/activate` is sourced
in bash (a real shell, the one process), the quickstart writes `demo-out/`, and each command of the
README's block then succeeds in that folder, in-process (tests.cli_run.invoke_cli), with the registry
where the README says it lands and the pulled file byte-identical to the registered one.
"""

from __future__ import annotations

import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_run import invoke_cli, user_environment

pytestmark = pytest.mark.slow  # runs the quickstart and a shell

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: The environment `make setup` creates and the README activates (the tests run in it).
VENV_BIN = Path(sys.executable).parent


def readme_commands() -> list[list[str]]:
    """The `normbridge ...` lines of the sh block after "with `.venv` activated", comments dropped."""
    text = README.read_text()
    block = re.search(r"with\s+`\.venv` activated:\s*```sh\n(.*?)```", text, re.S)
    assert block, "README.md has no sh block after 'with `.venv` activated:'"
    return [shlex.split(line, comments=True) for line in block.group(1).splitlines() if line.startswith("normbridge ")]


def test_the_readme_says_how_to_install_and_how_normbridge_gets_on_path():
    install = README.read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    for said in ('pip install ".[all]"', "make setup", ".venv/bin/normbridge", "source .venv/bin/activate"):
        assert said in install, f"the README's Install section does not say {said!r}"
    assert re.search(
        r'^normbridge = "cli\.main:main"$', (ROOT / "pyproject.toml").read_text(), re.M
    )  # the script pip puts in bin/


def test_after_activating_the_venv_normbridge_is_on_path(tmp_path):
    activate = VENV_BIN / "activate"
    assert activate.is_file(), f"{activate} missing: run the tests in the environment `make setup` creates"
    env = user_environment({"PATH": "/usr/bin:/bin"})  # a shell that knows nothing of the environment yet
    env.pop("VIRTUAL_ENV", None)
    shell = subprocess.run(
        ["bash", "-c", f"source {shlex.quote(str(activate))} && command -v normbridge && normbridge --version"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert shell.returncode == 0, shell.stderr[-2000:]
    found, version = shell.stdout.splitlines()[:2]
    assert Path(found).resolve() == (VENV_BIN / "normbridge").resolve() and version.startswith("normbridge ")


def test_the_quickstart_commands_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(ROOT / "examples" / "quickstart.py"), run_name="__main__")  # what `make demo` runs first
    assert ended.value.code == 0 and (tmp_path / "demo-out" / "bn_spec").is_dir()
    home = tmp_path / "home"
    env = {
        "HOME": str(home),
        "XDG_DATA_HOME": None,
        "NORMBRIDGE_HOME": None,
        "NORMBRIDGE_DB": None,
        "NORMBRIDGE_BLOBS": None,
    }
    commands = readme_commands()
    assert [c[1] for c in commands] == ["convert", "check", "inspect", "register", "show", "pull", "register", "pull"]
    for command in commands:
        done = invoke_cli(*command[1:], cwd=tmp_path, env=env, columns=120)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    assert (
        home / ".local" / "share" / "normbridge" / "registry.db"
    ).is_file()  # "in the registry under ~/.local/share/normbridge"
    assert (tmp_path / "pulled.onnx").read_bytes() == (tmp_path / "bn.onnx").read_bytes()  # "byte-identical"
    saved, back = tmp_path / "demo-out" / "llama-tuned", tmp_path / "llama-back"
    assert len(list(saved.glob("*.safetensors"))) > 1  # sharded, with its index
    assert {p.name: p.read_bytes() for p in back.iterdir()} == {p.name: p.read_bytes() for p in saved.iterdir()}


@pytest.mark.parametrize(
    "example,last_words", [("quickstart.py", "check"), ("registry_demo.py", "audit hash chain intact")]
)
def test_make_demo_s_examples_run_and_print_no_tensorflow_start_up_lines(tmp_path, example, last_words):
    """`make demo` runs both examples; issue 35 §3: oneDNN and absl lines leaked into their output (the registry demo's
    from the workers its registry starts); they quiet them as the CLI does (README)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example)],
        cwd=tmp_path,
        env=user_environment(),
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for said in ("oneDNN", "absl::InitializeLog", "rebuild TensorFlow"):
        assert said not in done.stdout + done.stderr
    assert last_words in done.stdout  # the example's own output is all there
