"""Hostile `.keras` files: a config.json that names module functions or code-loading layers is refused,
and nothing runs.

A genuine Keras 3 model (Dense, BatchNormalization, a Lambda over a Keras activation) is saved, then its config.json is
rewritten inside the zip as an attacker would: an activation or a layer class naming `os.system` or `builtins.eval`
through `module`/`registered_name`, a Lambda whose function is `torch.save` with `arguments={"f": marker}` (it writes
the marker when the model runs), a Keras non-modeling API (`keras.utils.get_file`) and a `TFSMLayer` (it loads a
SavedModel from a path). The control test shows the Lambda payload is live once the name resolves; the others assert
that `load_model`, `normbridge inspect` and `normbridge export` (in-process for every file, as real processes for one)
and a real `normbridge serve` refuse each file (bad_input_file, exit 6, HTTP 400),
that the marker never appears and that nothing is registered.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from converters.keras_adapter.runtime import import_keras
from converters.models.loading import load_model
from schemas import InputFileError
from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli
from tests.http_server import writer_server


def genuine_keras(path: Path) -> Path:
    keras = import_keras()
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(4, activation="relu", name="dense")(inputs)
    normalized = keras.layers.BatchNormalization(name="bn")(hidden)
    keras.Model(inputs, keras.layers.Lambda(keras.activations.relu, name="fn")(normalized)).save(path)
    return path


def craft_keras(genuine: Path, out: Path, edit: Callable[[dict], None]) -> Path:
    """`genuine` with its config.json edited in place (every other entry copied byte for byte)."""
    with zipfile.ZipFile(genuine) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "config.json":
                config = json.loads(data)
                edit(config)
                data = json.dumps(config).encode()
            target.writestr(info, data)
    return out


def layer(config: dict, name: str) -> dict:
    return next(entry for entry in config["config"]["layers"] if entry["config"].get("name") == name)


def function(module: str, name: str, registered: str | None = None) -> dict:
    """How Keras 3 serializes a reference to a function: module, 'function', its name, a registered name."""
    return {"module": module, "class_name": "function", "config": name, "registered_name": registered or name}


def _activation(reference: dict):
    def edit(config: dict, marker: Path) -> None:
        layer(config, "dense")["config"]["activation"] = reference

    return edit


def _layer_class(module: str, name: str):
    def edit(config: dict, marker: Path) -> None:
        entry = layer(config, "dense")
        entry.update(module=module, class_name=name, registered_name=name)

    return edit


def _lambda_writing(marker: Path, config: dict) -> None:
    fn = layer(config, "fn")["config"]
    fn["function"] = function("torch", "save")
    fn["arguments"] = {"f": str(marker)}
    fn["output_shape"] = [4]  # so Keras does not trace the function while building the model


def _tfsm_layer(config: dict, marker: Path) -> None:
    entry = layer(config, "fn")
    entry.update(class_name="TFSMLayer", registered_name=None)
    entry["config"] = {
        "name": "fn",
        "filepath": str(marker.parent / "saved_model"),
        "call_endpoint": "serve",
        "trainable": False,
    }


ATTACKS: dict[str, Callable[[dict, Path], None]] = {
    "activation_os_system": _activation(function("os", "system")),
    "activation_builtins_eval": _activation(function("builtins", "eval")),
    "activation_registered_eval": _activation(function("builtins", "eval", registered="builtins>eval")),
    "activation_non_modeling_api": _activation(function("keras.utils", "get_file")),
    "layer_class_builtins_eval": _layer_class("builtins", "eval"),
    "layer_class_os_system": _layer_class("os", "system"),
    "lambda_module_function": lambda config, marker: _lambda_writing(marker, config),
    "tfsm_layer": _tfsm_layer,
}


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> Path:
    return genuine_keras(tmp_path_factory.mktemp("genuine-keras") / "model.keras")


def hostile(name: str, genuine: Path, folder: Path) -> tuple[Path, Path]:
    marker = folder / f"{name}.marker"
    return craft_keras(genuine, folder / f"{name}.keras", lambda config: ATTACKS[name](config, marker)), marker


def test_the_lambda_payload_is_live_once_its_function_name_resolves(genuine, tmp_path):
    path, marker = hostile("lambda_module_function", genuine, tmp_path)
    keras = import_keras()
    model = keras.saving.load_model(path, custom_objects={"save": torch.save}, safe_mode=True, compile=False)
    with contextlib.suppress(Exception):  # torch.save opens (creates) the file before it tries to pickle the tensor
        model(np.ones((2, 6), np.float32))
    assert marker.exists(), (
        "the crafted Lambda no longer writes the marker when resolved: the attack is not live, update it"
    )


def test_the_genuine_model_loads(genuine):
    model = load_model(genuine)
    assert [type(layer).__name__ for layer in model.layers][1:] == ["Dense", "BatchNormalization", "Lambda"]


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_load_model_refuses_each_hostile_config_and_runs_nothing(name, genuine, tmp_path):
    path, marker = hostile(name, genuine, tmp_path)
    refused = None
    try:
        load_model(path)(
            np.ones((2, 6), np.float32)
        )  # the call is reached only if loading let it through: the payload runs there
    except InputFileError as error:
        refused = error
    assert not marker.exists(), f"the '{name}' payload ran"
    assert refused is not None and refused.code == "bad_input_file" and str(path) in str(refused), refused


def _cli_arguments(path: Path, folder: Path) -> dict[str, list[str]]:
    return {"inspect": ["inspect", str(path)], "export": ["export", str(path), "-o", str(folder / "served.onnx")]}


def _assert_refused_and_nothing_ran(results: dict[str, tuple[str, str, int]], marker: Path, folder: Path) -> None:
    for command, (stdout, stderr, code) in results.items():
        assert code == 6 and "bad_input_file" in stderr, f"{command}: exit {code}\n{stdout}{stderr}"
    assert not marker.exists() and not (folder / "served.onnx").exists()


#: Attacks also run through real processes: the Lambda whose payload is live once resolved.
#: Every attack runs in-process below.
PROCESS_ATTACKS = ("lambda_module_function",)


@pytest.mark.slow
@pytest.mark.parametrize("name", PROCESS_ATTACKS)
def test_inspect_and_export_processes_exit_6_and_run_nothing(name, genuine, tmp_path):
    path, marker = hostile(name, genuine, tmp_path)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "COLUMNS": "200"}
    processes = {
        cmd: subprocess.Popen(
            [*normbridge_command(), *args],
            cwd=tmp_path,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for cmd, args in _cli_arguments(path, tmp_path).items()
    }
    results = {
        command: (*process.communicate(timeout=600), process.returncode) for command, process in processes.items()
    }
    _assert_refused_and_nothing_ran(results, marker, tmp_path)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_inspect_and_export_exit_6_and_run_nothing(name, genuine, tmp_path):
    """The same commands in this process (the console script's app through CliRunner), for every attack."""
    path, marker = hostile(name, genuine, tmp_path)
    results = {}
    for command, args in _cli_arguments(path, tmp_path).items():
        done = invoke_cli(*args, cwd=tmp_path, columns=200)
        results[command] = (done.stdout, done.stderr, done.returncode)
    _assert_refused_and_nothing_ran(results, marker, tmp_path)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with writer_server(tmp_path_factory.mktemp("keras-server"), "uploader") as (client, _, _):
        yield client


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_the_server_answers_400_to_each_hostile_keras_upload_and_registers_nothing(name, genuine, server, tmp_path):
    path, marker = hostile(name, genuine, tmp_path)
    model = name.replace("_", "-")
    response = server.post(f"/api/v1/models/{model}/versions", params={"format": "keras"}, content=path.read_bytes())
    assert not marker.exists()
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_input_file", response.text
    assert server.get(f"/api/v1/models/{model}/versions").status_code == 404
