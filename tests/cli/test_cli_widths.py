"""Every table-printing command fits COLUMNS=80 and COLUMNS=60 without breaking a number or a name across lines.

Stdout captured (not a terminal), as in `normbridge show x | less`: every command in-process (the console script's app
through CliRunner, COLUMNS set as a shell sets it) and one as a real process with stdout piped. Each command is run once
at 1000 columns, where nothing wraps, and then at 80 and 60: no line may be longer than COLUMNS, and every word of the
wide output (a number, a layer path, a digest prefix, a header word) must appear whole on some line of the narrow one;
only a word longer than the whole line may be folded. Known values (layer paths, eps, alias, token owner) are checked by
name too.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from schemas import save_spec
from tests.cli_run import invoke_cli, run_cli
from testkit.model_zoo import torch_resnet_small, train_batchnorm_statistics
from tests.spec_factory import make_spec

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

WIDE = 1000
NARROW = (80, 60)
#: Table rules and borders: not words.
BORDERS = re.compile(r"[\s│┃┏┓┗┛┡┩━─┳╇┻┼╋└┘┌┐├┤┬┴═╭╮╰╯╷╵╹╻]+")
BATCH = torch.export.Dim("batch", min=1, max=64)


def save_resnet(model: torch.nn.Module, path: Path) -> None:
    torch.export.save(torch.export.export(model, (torch.randn(2, 3, 32, 32),), dynamic_shapes=({0: BATCH},)), path)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """Models (two trained ResNet versions, a fresh Keras model, their ONNX export), inputs,
    a spec and a filled registry."""
    import keras

    folder = tmp_path_factory.mktemp("widths")
    env = {
        "NORMBRIDGE_DB": f"sqlite:///{folder / 'registry.db'}",
        "NORMBRIDGE_BLOBS": str(folder / "blobs"),
        "NORMBRIDGE_USER": "width-tester",
    }
    torch.manual_seed(0)
    model = train_batchnorm_statistics(torch_resnet_small(), [torch.randn(16, 3, 32, 32) * 0.01 for _ in range(3)])
    save_resnet(model, folder / "resnet.pt2")
    save_resnet(
        train_batchnorm_statistics(model, [torch.randn(16, 3, 32, 32) * 3 + 1 for _ in range(3)]),
        folder / "resnet2.pt2",
    )
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 12, 3))
    x = keras.layers.BatchNormalization(epsilon=1e-3, name="bn")(keras.layers.Conv2D(8, 3, padding="same")(inputs))
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="ln")(keras.layers.GlobalAveragePooling2D()(x))
    keras.Model(inputs, x).save(folder / "small.keras")
    np.save(folder / "inputs.npy", np.random.default_rng(0).standard_normal((16, 3, 32, 32)).astype(np.float32) * 2)
    save_spec(make_spec("batch", name="features.1", eps=1e-3, momentum=0.01, source="torch"), folder / "bn")
    setup = [
        ("export", "resnet.pt2", "--to", "onnx", "-o", "resnet.onnx"),
        ("register", "resnet", "resnet.pt2", "--note", "first epoch"),
        ("register", "resnet", "resnet2.pt2", "--note", "statistics recalibrated on shifted inputs"),
        ("alias", "resnet", "production", "resnet@2"),
        (
            "token",
            "create",
            "--owner",
            "nightly-ci",
            "--role",
            "write",
            "--model",
            "resnet",
            "--note",
            "for the nightly pipeline",
        ),
    ]
    for args in setup:
        done = invoke_cli(*args, cwd=folder, env=env)
        assert done.returncode == 0, (args, done.stderr[-2000:])
    return folder, env


#: command -> (arguments, values that must appear whole on one line at every width)
COMMANDS = {
    "inspect .pt2": (["inspect", "resnet.pt2"], ["layer2.0.downsample.1", "1e-05", "(batch_weight)"]),
    "inspect .keras": (
        ["inspect", "small.keras"],
        ["BatchNormalization", "LayerNormalization", "never_trained", "eps_not_default"],
    ),
    "models": (["models"], ["resnet"]),
    "versions": (["versions", "resnet"], ["fine-tuned", "production", "resnet@1"]),
    "show": (["show", "resnet@2"], ["layer2.0.downsample.1", "(batch_weight)", "passed"]),
    "diff": (["diff", "resnet@1", "resnet@2"], ["layer2.0.downsample.1.running_var", "num_batches_tracked"]),
    "audit": (["audit"], ["width-tester", "token_create", "resnet@2"]),
    "token list": (["token", "list"], ["nightly-ci", "write", "pipeline"]),
    "drift": (["drift", "resnet.onnx", "inputs.npy"], ["layer2.0.downsample.1", "DRIFT"]),
    "contract": (["contract", "resnet.pt2", "resnet.onnx"], ["PASSED", "deterministic"]),
    "check": (["check", "bn"], ["features.1", "PASSED"]),
    "export": (
        ["export", "resnet.pt2", "--to", "onnx", "-o", "again.onnx"],
        ["layer2.0.downsample.1", "node__native_batch_norm_legit_no_training__0", "1e-05"],
    ),
    "recalibrate": (
        ["recalibrate", "resnet.pt2", "inputs.npy", "-o", "recalibrated.pt2"],
        ["layer2.0.downsample.1", "channels"],
    ),
}
#: Exit codes that are verdicts, not failures (drift alarms on the shifted inputs).
VERDICTS = {"drift": 11}


def words(text: str) -> set[str]:
    return {word for word in BORDERS.split(text) if word}


#: Commands also run as real processes (stdout a pipe, COLUMNS from the environment at start-up).
PROCESS_COMMANDS = ("inspect .pt2",)


@pytest.mark.parametrize(
    "what, how", [(w, "in-process") for w in COMMANDS] + [(w, "process") for w in PROCESS_COMMANDS]
)
def test_output_fits_the_width_with_every_value_whole(work, what, how):
    folder, env = work
    args, values = COMMANDS[what]
    expected_code = VERDICTS.get(what, 0)
    run_cli_as = run_cli if how == "process" else invoke_cli
    wide = run_cli_as(*args, cwd=folder, env=env, columns=WIDE)
    assert wide.returncode == expected_code, wide.stderr[-3000:]
    for value in values:
        assert value in words(wide.stdout), f"{what}: {value!r} missing from the wide output"
    for width in NARROW:
        narrow = run_cli_as(*args, cwd=folder, env=env, columns=width)
        assert narrow.returncode == expected_code, narrow.stderr[-3000:]
        lines = narrow.stdout.splitlines()
        too_long = [line for line in lines if len(line) > width]
        assert not too_long, f"{what} at {width} columns: {len(too_long)} lines longer, e.g. {too_long[0]!r}"
        found = set().union(*(words(line) for line in lines))
        broken = sorted(w for w in words(wide.stdout) - found if len(w) <= width - 4)
        assert not broken, f"{what} at {width} columns broke {broken[:10]} across lines:\n{narrow.stdout[:3000]}"
        for value in values:
            assert any(value in words(line) for line in lines), (
                f"{what} at {width} columns: {value!r} not whole on any line"
            )


def command_paths() -> list[list[str]]:
    """Every command and subcommand of the app, as its words (`["token", "create"]`)."""
    import typer

    from cli.main import app

    def walk(group, prefix: list[str]):
        for name, command in group.commands.items():
            yield from walk(command, [*prefix, name]) if hasattr(command, "commands") else [[*prefix, name]]

    return list(walk(typer.main.get_command(app), []))


def test_every_help_fits_80_columns_without_cutting_a_word(tmp_path):
    for path in command_paths():
        done = invoke_cli(*path, "--help", cwd=tmp_path, columns=80)
        assert done.returncode == 0, (path, done.stderr)
        lines = done.stdout.splitlines()
        assert not [line for line in lines if len(line) > 80], f"{' '.join(path)} --help is wider than 80 columns"
        cut = [line for line in lines if "…" in line]
        assert not cut, f"{' '.join(path)} --help cuts a word or an option name at 80 columns: {cut}"
        usage = next(line for line in lines if "Usage:" in line)
        assert "[[" not in usage and "]]" not in usage, usage


def test_a_cell_cut_for_length_ends_in_an_ellipsis_after_a_whole_word():
    from cli.fitting import clipped

    message = "no normalization layer was found among the model's 7 tensors, so the equivalence check would check nothing. Nothing was registered."
    cut = clipped(message, 120)
    assert len(cut) <= 120 and cut.endswith("…") and message.startswith(cut[:-1])
    assert cut[:-1].split()[-1] in message.split()  # the last word kept is whole
    assert clipped("short", 120) == "short"
