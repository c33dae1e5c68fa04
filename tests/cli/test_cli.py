"""The `normbridge` command as a user runs it: real files, exit codes scripts can trust.

`process` starts the installed command (convert then check, and --help, run that way); `run` runs the
console script's app in this process (tests.cli_run.invoke_cli) for the rows that only vary the arguments.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from schemas import load_spec, save_spec

from tests.cli_run import invoke_cli
from tests.spec_factory import make_spec

SCRIPT = Path(sys.executable).parent / "normbridge"


def process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "cli.main"]
    return subprocess.run(command + list(args), capture_output=True, text=True, cwd=cwd, timeout=300)


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return invoke_cli(*args, cwd=cwd or Path.cwd())


@pytest.fixture
def bn_folder(tmp_path):
    return save_spec(make_spec("batch", name="features.1", eps=1e-3, momentum=0.01, source="torch"), tmp_path / "bn")


@pytest.mark.slow
def test_convert_spec_to_onnx_then_check_the_onnx_file(bn_folder, tmp_path):
    out = tmp_path / "bn.onnx"
    done = process("convert", str(bn_folder), "--to", "onnx", "-o", str(out), "--opset", "23")
    assert done.returncode == 0, done.stderr
    assert out.is_file() and "BatchNormalization" in done.stdout and "features.1" in done.stdout
    checked = process("check", str(out), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    result = json.loads(checked.stdout)
    assert result["passed"] is True and result["layer"] == "features.1"


@pytest.mark.slow
def test_convert_json_report_carries_eps_and_momentum(bn_folder, tmp_path):
    done = run("convert", str(bn_folder), "--to", "keras", "-o", str(tmp_path / "bn.keras"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["report"]["layers"][0]
    settings = {t["setting"]: t for t in report["translations"]}
    assert settings["eps"]["source_value"] == 0.001 and settings["eps"]["target_value"] == 0.001
    assert settings["momentum"]["source_value"] == 0.01 and settings["momentum"]["target_value"] == 0.99
    assert (tmp_path / "bn.keras").is_file()


@pytest.mark.slow
def test_convert_to_spec_and_torch_folders(bn_folder, tmp_path):
    assert run("convert", str(bn_folder), "--to", "spec", "-o", str(tmp_path / "copy")).returncode == 0
    assert load_spec(tmp_path / "copy") == load_spec(bn_folder)
    assert run("convert", str(bn_folder), "--to", "torch", "-o", str(tmp_path / "t")).returncode == 0
    from safetensors.numpy import load_file

    state = load_file(str(tmp_path / "t" / "state_dict.safetensors"))
    assert np.array_equal(state["running_var"], load_spec(bn_folder).tensors["running_var"])


@pytest.mark.slow
def test_train_mode_to_onnx_is_refused_and_nothing_is_written(tmp_path):
    folder = save_spec(make_spec("batch", name="head.bn", training=True), tmp_path / "bn")
    out = tmp_path / "bn.onnx"
    done = run("convert", str(folder), "--to", "onnx", "-o", str(out))
    assert done.returncode == 4
    assert "head.bn" in done.stderr and "training" in done.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [folder]
    allowed = run("convert", str(folder), "--to", "onnx", "-o", str(out), "--training-mode")
    assert allowed.returncode == 0 and out.is_file()


def written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "make_input, code, phrase",
    [
        (lambda p: p / "missing.onnx", 6, "does not exist"),
        (lambda p: written(p / "model.pt", pickle.dumps({"a": 1})), 6, "can execute code"),
        (lambda p: written(p / "broken.onnx", b"not a protobuf"), 6, "broken.onnx"),
    ],
    ids=["missing", "pickle", "corrupt-onnx"],
)
def test_bad_inputs_exit_non_zero_with_a_reason(tmp_path, make_input, code, phrase):
    path = make_input(tmp_path)
    done = run("check", str(path))
    assert done.returncode == code, done.stdout + done.stderr
    assert phrase in done.stderr


@pytest.mark.slow
def test_a_spec_with_invalid_values_exits_3(bn_folder):
    document = json.loads((bn_folder / "spec.json").read_text())
    document["eps"] = -1.0
    (bn_folder / "spec.json").write_text(json.dumps(document))
    done = run("check", str(bn_folder))
    assert done.returncode == 3 and "eps" in done.stderr and "features.1" in done.stderr


@pytest.mark.slow
def test_a_foreign_train_mode_onnx_file_is_read_as_train_mode(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = 3
    arrays = (
        (np.ones(c, np.float32), "s"),
        (np.zeros(c, np.float32), "b"),
        (np.zeros(c, np.float32), "m"),
        (np.ones(c, np.float32), "v"),
    )
    node = helper.make_node(
        "BatchNormalization", ["X", "s", "b", "m", "v"], ["Y"], epsilon=1e-5, training_mode=1, name="bn"
    )
    shape = ["N", c, "H", "W"]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)],
        initializer=[numpy_helper.from_array(a, n) for a, n in arrays],
    )
    path = tmp_path / "train.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), str(path))
    done = run("check", str(path), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    targets = {t["framework"]: t for t in json.loads(done.stdout)["targets"]}
    assert targets["onnx"]["status"] == "not_expressible" and "training" in targets["onnx"]["reason"]


@pytest.mark.slow
def test_help_lists_the_commands():
    listing = process("--help")
    assert listing.returncode == 0
    for command in ("convert", "check", "schema"):
        assert command in listing.stdout


@pytest.mark.slow
def test_schema_command_prints_the_json_schema():
    done = run("schema", "normspec")
    assert done.returncode == 0 and json.loads(done.stdout)["title"] == "NormSpec"
    assert run("schema", "nonsense").returncode == 2


def registered_commands() -> list[str]:
    from cli.main import app

    return [c.name or c.callback.__name__ for c in app.registered_commands]


def test_docs_document_every_command():
    """The hand-written pages name every command (docs/cli.md is generated from the help, so it does not count)."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    prose = "\n".join(page.read_text() for page in sorted(docs.glob("*.md")) if page.name != "cli.md")
    for command in registered_commands():
        assert f"normbridge {command}" in prose, f"no page in docs/ documents `normbridge {command}`"


@pytest.mark.slow
def test_every_registered_command_has_help_with_an_example():
    for command in registered_commands():
        helped = run(command, "--help")
        assert helped.returncode == 0 and "Example" in helped.stdout, command


def test_every_command_module_is_registered():
    """cli/main.py imports its command modules explicitly: one left out would silently drop its commands.

    Every file of cli/commands/ is in COMMAND_MODULES, and every module listed registers commands on
    the app (directly or in a group), so the list holds no module that adds nothing.
    """
    import importlib

    from cli.main import COMMAND_MODULES, app

    folder = Path(__file__).resolve().parents[2] / "cli" / "commands"
    modules = {f"cli.commands.{path.stem}" for path in folder.glob("*.py") if path.stem != "__init__"}
    assert modules == {module.__name__ for module in COMMAND_MODULES}
    assert all(importlib.import_module(name) in COMMAND_MODULES for name in modules)
    commands = list(app.registered_commands)
    for group in app.registered_groups:
        commands += group.typer_instance.registered_commands
    registering = {command.callback.__module__ for command in commands}
    assert registering == modules, (
        f"listed but registering nothing: {sorted(modules - registering)}; registering but not listed: {sorted(registering - modules)}"
    )


#: Runs `normbridge --help` as `python -m cli.main` does, delivering a real SIGINT to the process while cli.app is being
#: imported.
INTERRUPTED_WHILE_IMPORTING = """
import importlib.abc, os, runpy, signal, sys

class InterruptAtImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "cli.app":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptAtImport())
sys.argv = ["normbridge", "--help"]
runpy.run_module("cli.main", run_name="__main__")
"""


def test_ctrl_c_while_the_command_starts_exits_130_without_a_traceback():
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_WHILE_IMPORTING],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert run.returncode == 130, run.stderr[-2000:]
    assert run.stderr.strip() == "interrupted while starting" and "Traceback" not in run.stderr and run.stdout == ""


@pytest.mark.parametrize("given", [["--token", "nbt_0123456789ab_secret"], []], ids=["--token", "NORMBRIDGE_TOKEN"])
def test_a_token_without_a_server_is_refused_and_opens_no_local_registry(given, tmp_path):
    """A token means a server was meant: the local registry is never opened with it (issue 35)."""
    home = tmp_path / "home"
    env = {**os.environ, "NORMBRIDGE_HOME": str(home), "COLUMNS": "200"}
    env.pop("NORMBRIDGE_SERVER", None)
    if not given:
        env["NORMBRIDGE_TOKEN"] = "nbt_0123456789ab_secret"
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "cli.main"]
    done = subprocess.run(command + given + ["models"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--server URL" in done.stderr and "NORMBRIDGE_TOKEN" in done.stderr
    assert not home.exists()  # nothing was created
