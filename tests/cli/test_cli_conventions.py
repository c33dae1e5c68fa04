"""The command line behaves like the tools ML engineers already use (issue 16, part A).

A few rows run as real processes (the umask, the exit status and the completion script as a shell
sees them); the rest run the console script's app in this process (tests.cli_run.invoke_cli).

Files written for the user get the mode the umask gives (0644 / 0755 under 022, not 0600), while the
registry's database, folders and read-only blobs stay private to their owner (tests/registry/test_file_modes.py); usage
mistakes exit 2 with the usage line while registry refusals keep exit 14; `--version`, shell
completion, flags without a `<bool>` placeholder; `convert --to keras` refuses an output Keras
could not load, and the file it writes loads with safe_mode=True.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch

from schemas import save_spec
from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli, run_cli, user_environment
from testkit.model_zoo import torch_resnet_small
from tests.spec_factory import make_spec

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder with a BatchNorm spec folder and a small ResNet as .pt2 plus matching inputs."""
    folder = tmp_path_factory.mktemp("conventions")
    save_spec(make_spec("batch", name="features.1", eps=1e-3, momentum=0.01, source="torch"), folder / "bn")
    torch.manual_seed(0)
    model = torch_resnet_small().eval()
    program = torch.export.export(
        model, (torch.randn(2, 3, 32, 32),), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},)
    )
    torch.export.save(program, folder / "resnet.pt2")
    np.save(folder / "inputs.npy", np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32))
    return folder


# -- 1. modes ------------------------------------------------------------------------------------


WRITES = {
    "onnx": (["convert", "bn", "--to", "onnx", "-o", "{out}.onnx"], "{out}.onnx"),
    "keras": (["convert", "bn", "--to", "keras", "-o", "{out}.keras"], "{out}.keras"),
    "spec folder": (["convert", "bn", "--to", "spec", "-o", "{out}_spec"], "{out}_spec"),
    "torch folder": (["convert", "bn", "--to", "torch", "-o", "{out}_torch"], "{out}_torch"),
    "serving export": (["export", "resnet.pt2", "--to", "onnx", "-o", "{out}_served.onnx"], "{out}_served.onnx"),
    "recalibrated": (
        ["recalibrate", "resnet.pt2", "inputs.npy", "-o", "{out}_recalibrated.pt2"],
        "{out}_recalibrated.pt2",
    ),
}


def written_modes(path: Path) -> dict[str, int]:
    """Mode of `path` and, for a folder, of everything in it (relative names)."""
    modes = {".": mode(path)}
    if path.is_dir():
        modes.update({str(p.relative_to(path)): mode(p) for p in path.rglob("*")})
    return modes


#: Writers also run as real processes (the umask inherited from the shell): a file and a folder.
#: Every writer runs in-process.
PROCESS_WRITES = ("onnx", "spec folder")


@pytest.mark.parametrize("what, how", [(w, "in-process") for w in WRITES] + [(w, "process") for w in PROCESS_WRITES])
def test_outputs_get_the_umask_mode_like_any_file_the_user_writes(work, what, how):
    args, target = WRITES[what]
    run = run_cli if how == "process" else invoke_cli
    for umask, file_mode, folder_mode in ((0o022, 0o644, 0o755), (0o077, 0o600, 0o700)):
        out = f"{what.replace(' ', '_')}_{how}_{umask:03o}"
        done = run(*[a.format(out=out) for a in args], cwd=work, umask=umask)
        assert done.returncode == 0, done.stderr[-2000:]
        path = work / target.format(out=out)
        for name, found in written_modes(path).items():
            expected = folder_mode if (path / name if name != "." else path).is_dir() else file_mode
            assert found == expected, f"{what} {name} under umask {umask:03o}: {found:04o}, expected {expected:04o}"


def test_the_registry_stays_private_whatever_the_umask(work):
    """The database, the blob files (read-only) and their folders: private to their owner under 022 as under 077 (they
    hold every registered model; NORMBRIDGE_SHARED_GROUP=1 shares them with a group:
    tests/registry/test_file_modes.py)."""
    for umask, db_mode, blob_mode, folder_mode in ((0o022, 0o600, 0o400, 0o700), (0o077, 0o600, 0o400, 0o700)):
        home = work / f"registry_{umask:03o}"
        env = {"NORMBRIDGE_DB": f"sqlite:///{home / 'registry.db'}", "NORMBRIDGE_BLOBS": str(home / "blobs")}
        assert invoke_cli("convert", "bn", "--to", "onnx", "-o", f"bn_{umask:03o}.onnx", cwd=work).returncode == 0
        done = invoke_cli("register", "bn", f"bn_{umask:03o}.onnx", cwd=work, env=env, umask=umask)
        assert done.returncode == 0, done.stderr
        blobs = [p for p in (home / "blobs").rglob("*") if p.is_file()]
        assert blobs and {mode(p) for p in blobs} == {blob_mode}, (
            f"blobs under umask {umask:03o}: {sorted({oct(mode(p)) for p in blobs})}"
        )
        assert mode(home / "registry.db") == db_mode
        folders = [home, home / "blobs", *(p for p in (home / "blobs").rglob("*") if p.is_dir())]
        assert {mode(p) for p in folders} == {folder_mode}, f"folders under umask {umask:03o}"


def test_replacing_a_file_keeps_its_permissions(work):
    target = work / "private.onnx"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    done = invoke_cli("convert", "bn", "--to", "onnx", "-o", target.name, cwd=work, umask=0o022)
    assert done.returncode == 0, done.stderr
    assert mode(target) == 0o640 and target.read_bytes() != b"old"


# -- 4. --version, completion, flags, usage errors -----------------------------------------------


def test_version_prints_the_installed_version(tmp_path):
    done = run_cli("--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"normbridge {metadata.version('normbridge')}"


def test_flags_show_no_bool_placeholder_in_help(tmp_path):
    for command in (
        ["--help"],
        ["convert", "--help"],
        ["inspect", "--help"],
        ["token", "create", "--help"],
        ["mlflow", "import", "--help"],
    ):
        done = (run_cli if command == ["--help"] else invoke_cli)(
            *command, cwd=tmp_path, columns=200
        )  # the root's help as a process
        assert done.returncode == 0, done.stderr
        assert "--json" in done.stdout or "--verbose" in done.stdout or "--trust-pickle" in done.stdout
        assert "<bool>" not in done.stdout, " ".join(command)
    assert (
        "<int>" in invoke_cli("convert", "--help", cwd=tmp_path, columns=200).stdout
    )  # an option that takes a value keeps its type


def test_shell_completion_as_typer_offers_it(tmp_path):
    # Typer detects the shell from the process tree (shellingham): typed in bash, as a user does, whatever runs the
    # tests. (a second command keeps bash from exec-ing normbridge in its place, which would hide bash from the
    # detection)
    command = " ".join(shlex.quote(part) for part in normbridge_command() + ["--show-completion"]) + "; exit $?"
    script = subprocess.run(
        ["bash", "-c", command],
        cwd=tmp_path,
        env=user_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert (
        script.returncode == 0
        and "_NORMBRIDGE_COMPLETE=complete_bash" in script.stdout
        and "complete " in script.stdout
    )
    complete = {"_NORMBRIDGE_COMPLETE": "complete_bash", "COMP_CWORD": "1", "COMP_WORDS": "normbridge insp"}
    assert invoke_cli(cwd=tmp_path, env=complete).stdout.split() == ["inspect"]
    roles = {**complete, "COMP_CWORD": "4", "COMP_WORDS": "normbridge token create --role "}
    assert invoke_cli(cwd=tmp_path, env=roles).stdout.split() == ["read", "write", "admin"]


@pytest.fixture(scope="module")
def registry(work) -> dict[str, str]:
    """A registry with two one-layer models, a@1 and b@1 (ONNX files written by `convert`)."""
    env = {"NORMBRIDGE_DB": f"sqlite:///{work / 'usage.db'}", "NORMBRIDGE_BLOBS": str(work / "usage_blobs")}
    for name, seed in (("a", 1), ("b", 2)):
        save_spec(make_spec("batch", name="bn", seed=seed, source="torch"), work / f"{name}_spec")
        assert invoke_cli("convert", f"{name}_spec", "--to", "onnx", "-o", f"{name}.onnx", cwd=work).returncode == 0
        done = invoke_cli("register", name, f"{name}.onnx", cwd=work, env=env)
        assert done.returncode == 0, done.stderr
    return env


USAGE_MISTAKES = {
    "malformed NAME@N": (["show", "a@"], "'a@' is not a version reference"),
    "NAME@N with a space": (["diff", "a@1", "a b@2"], "'a b@2' is not a version reference"),
    "bad verify reference": (["verify", "@1"], "'@1' is not a version reference"),
    "bad parent": (["register", "a", "a.onnx", "--parent", "a@@1"], "'a@@1' is not a version reference"),
    "bad model name": (["register", "my model", "a.onnx"], "'my model' is not a model name"),
    "bad alias name": (["alias", "a", "latest", "a@1"], "'latest' cannot be an alias"),
    "numeric alias": (["alias", "a", "7", "a@1"], "'7' cannot be an alias"),
    "bad role": (["token", "create", "--owner", "ci", "--role", "boss"], "'boss' is not a role"),
    "bad token scope": (
        ["token", "create", "--owner", "ci", "--role", "read", "--model", "x/y"],
        "'x/y' is not a model name",
    ),
    "bad export reference": (
        ["export-layers", "a@x@", "--to", "onnx", "-o", "out"],
        "'a@x@' is not a version reference",
    ),
    "a bad version given to export": (
        ["export", "a@x@", "--to", "onnx", "-o", "out"],
        "'a@x@' is not a version reference",
    ),
    "bad pull reference": (["pull", "a@", "-o", "out"], "'a@' is not a version reference"),
    "bad drift record": (["drift", "a.onnx", "inputs.npy", "--record", "a@"], "'a@' is not a version reference"),
    "unknown operation": (
        ["register", "a", "a.onnx", "--operation", "retrained"],
        "'retrained' is not a lineage operation",
    ),
    "negative grace": (["gc", "--grace", "-1"], "'--grace': Input should be greater than or equal to 0"),
    "unknown framework": (
        ["check", "bn", "--framework", "tflite"],
        "'tflite' is not a framework; choose torch, keras or onnx",
    ),
    "opset below the converters'": (
        ["convert", "bn", "--to", "onnx", "-o", "low.onnx", "--opset", "12"],
        "12 is below opset 13",
    ),
    "check at opset 0": (["check", "bn", "--opset", "0"], "0 is below opset 13"),
    "export at opset 0": (
        ["export", "resnet.pt2", "-o", "zero.onnx", "--opset", "0"],
        "'--opset': Input should be greater than or equal to 1",
    ),
    "export to a layer format": (
        ["export", "resnet.pt2", "--to", "torch", "-o", "out"],
        "written as torch files by normbridge export-layers",
    ),
    "unknown schema": (["schema", "bogus"], "'bogus' is not a schema; choose one of normspec"),
}


#: Usage mistakes also made to a real process; click parses every one the same way, so the others run in-process.
PROCESS_MISTAKES = ("malformed NAME@N",)


@pytest.mark.parametrize(
    "mistake, how", [(m, "in-process") for m in USAGE_MISTAKES] + [(m, "process") for m in PROCESS_MISTAKES]
)
def test_usage_mistakes_exit_2_with_the_usage_line(work, registry, mistake, how):
    args, message = USAGE_MISTAKES[mistake]
    done = (run_cli if how == "process" else invoke_cli)(*args, cwd=work, env=registry, columns=400)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.startswith("error (usage): "), done.stderr  # one error style: the one every other error has
    assert f"usage: normbridge {args[0]}" in done.stderr and "╭" not in done.stderr, done.stderr
    assert message in " ".join(done.stderr.split()) and done.stdout == ""


def test_a_registry_refusal_still_exits_14(work, registry):
    done = run_cli("alias", "a", "production", "b@1", cwd=work, env=registry)
    assert done.returncode == 14, done.stderr
    assert "cannot point at 'b@1'" in done.stderr and "Usage:" not in done.stderr
    assert invoke_cli("alias", "a", "production", "a@1", cwd=work, env=registry).returncode == 0


ALIASES = ["production", "prod-2", "v1.2", "2x", "latest", "7", "a b", "a@b", "", "-x", "_x", "x" * 128, "x" * 129]


def test_cli_alias_rule_is_the_registry_rule(tmp_path):
    """Every alias the command line refuses as a usage error, the registry refuses too, and the other way round."""
    import typer

    from cli.arguments import alias_name
    from registry.service import Registry
    from schemas.errors import RegistryError

    registry = Registry(db=f"sqlite:///{tmp_path / 'r.db'}", blobs=str(tmp_path / "blobs"))
    save_spec(make_spec("batch", name="bn", source="torch"), tmp_path / "spec")
    assert invoke_cli("convert", "spec", "--to", "onnx", "-o", "m.onnx", cwd=tmp_path).returncode == 0
    registry.register("m", tmp_path / "m.onnx")
    for alias in ALIASES:
        try:
            alias_name(alias)
            cli_accepts = True
        except typer.BadParameter:
            cli_accepts = False
        try:
            registry.set_alias("m", alias, "m@1")
            registry_accepts = True
        except RegistryError:
            registry_accepts = False
        assert cli_accepts == registry_accepts, repr(alias)


# -- 11. convert --to keras ----------------------------------------------------------------------


def test_convert_to_keras_refuses_an_output_keras_cannot_load(work):
    done = invoke_cli("convert", "bn", "--to", "keras", "-o", "out_keras", cwd=work, columns=400)
    assert done.returncode == 2, done.stderr
    assert "--output" in done.stderr and ".keras" in done.stderr and "out_keras.keras" in done.stderr
    assert not (work / "out_keras").exists()


def test_convert_to_keras_writes_a_file_keras_loads_in_safe_mode(work):
    done = invoke_cli("convert", "bn", "--to", "keras", "-o", "layer.keras", cwd=work)
    assert done.returncode == 0, done.stderr
    import keras

    model = keras.saving.load_model(work / "layer.keras", safe_mode=True)
    layer = next(layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization))
    assert layer.epsilon == pytest.approx(1e-3) and layer.momentum == pytest.approx(0.99)
