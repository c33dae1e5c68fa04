"""Successful runs keep stderr for normbridge: no TensorFlow, absl, torch.onnx or FutureWarning lines unless --verbose.

Real processes with the user's environment (no TF_CPP_MIN_LOG_LEVEL) and TF_ENABLE_ONEDNN_OPTS=1,
which makes TensorFlow print its oneDNN notice here as it does by default on CPUs with AVX-512
(twice, and from C++ before its log level applies). normbridge's own findings about the model
(hazards) still print; `--verbose` (or NORMBRIDGE_VERBOSE=1) brings the frameworks' lines back.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cli.framework_noise import without_startup_noise
from tests.cli_run import invoke_cli, run_cli
from testkit.model_zoo import torch_resnet_small

ONEDNN_ON = {"TF_ENABLE_ONEDNN_OPTS": "1"}
FRAMEWORK_MARKERS = (
    "oneDNN",
    "absl",
    "cpu_feature_guard",
    "torchvision",
    "FutureWarning",
    "DeprecationWarning",
    "Traceback",
    "tf2onnx",
    "W0000",
    "I0000",
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A small ResNet as .pt2 and a Keras model with one layer of each kind as .keras
    (fresh statistics: a hazard to report)."""
    import keras

    folder = tmp_path_factory.mktemp("quiet")
    torch.manual_seed(0)
    program = torch.export.export(
        torch_resnet_small().eval(),
        (torch.randn(2, 3, 32, 32),),
        dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},),
    )
    torch.export.save(program, folder / "resnet.pt2")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 12, 3), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    x = keras.layers.BatchNormalization(epsilon=1e-3, name="bn")(x)
    x = keras.layers.GroupNormalization(groups=2, epsilon=1e-4, name="gn")(keras.layers.ReLU()(x))
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="ln")(keras.layers.GlobalAveragePooling2D()(x))
    keras.Model(inputs, keras.layers.Dense(3)(x), name="small").save(folder / "small.keras")
    np.save(folder / "images.npy", np.random.default_rng(0).standard_normal((8, 12, 12, 3)).astype(np.float32))
    return folder


def framework_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(marker in line for marker in FRAMEWORK_MARKERS)]


COMMANDS = {
    "inspect .pt2": ["inspect", "resnet.pt2"],
    "inspect .keras": ["inspect", "small.keras"],
    "export .pt2": ["export", "resnet.pt2", "--to", "onnx", "-o", "resnet.onnx"],
    "export .keras": ["export", "small.keras", "--to", "onnx", "-o", "small.onnx"],
    "drift .keras": ["drift", "small.keras", "images.npy"],
}
#: Exit codes that are verdicts, not failures: drift finds the fresh statistics never converged (23).
VERDICTS = {"drift .keras": 23}


@pytest.mark.slow
@pytest.mark.parametrize("what", list(COMMANDS))
def test_a_successful_run_prints_nothing_on_stderr(models, what):
    done = run_cli(*COMMANDS[what], cwd=models, env=ONEDNN_ON, columns=120)
    assert done.returncode == VERDICTS.get(what, 0), done.stderr[-3000:]
    assert done.stderr == "", f"framework lines on stderr: {framework_lines(done.stderr) or done.stderr[:2000]}"
    if what.startswith("inspect"):
        assert "never_trained" in done.stdout  # normbridge's own warning about the model is still printed
    elif what.startswith("drift"):
        assert "unconverged_statistics" in done.stdout  # and its verdict
    else:
        assert "wrote" in done.stdout


@pytest.mark.slow
def test_verbose_brings_tensorflow_start_up_lines_back(models):
    done = run_cli("--verbose", "inspect", "small.keras", cwd=models, env=ONEDNN_ON, columns=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("oneDNN custom operations are on") == 2, done.stderr[:3000]
    assert "absl::InitializeLog()" in done.stderr
    quiet = invoke_cli(
        "inspect", "small.keras", cwd=models, env=ONEDNN_ON, columns=120
    )  # in-process: only its stdout counts here
    assert quiet.stdout == done.stdout  # the same report either way


@pytest.mark.slow
def test_verbose_brings_torch_onnx_and_warning_lines_back(models):
    done = run_cli("--verbose", "export", "resnet.pt2", "--to", "onnx", "-o", "verbose.onnx", cwd=models, columns=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torchvision is not installed" in done.stderr, done.stderr[:3000]
    by_env = run_cli(
        "export",
        "resnet.pt2",
        "--to",
        "onnx",
        "-o",
        "verbose_env.onnx",
        cwd=models,
        columns=120,
        env={"NORMBRIDGE_VERBOSE": "1"},
    )
    assert by_env.returncode == 0 and "torchvision is not installed" in by_env.stderr


def test_only_the_known_start_up_lines_are_dropped():
    captured = (
        b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        b"I0000 00:00:1796121933.715640   31249 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical "
        b"results due to floating-point round-off errors from different computation orders.\n"
        b"I0000 00:00:1796119452.223262   12195 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU "
        b"instructions in performance-critical operations.\n"
        b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.\n"
        b"E0000 00:00:1796121933.715640   31249 some_kernel.cc:12] could not open model.pb: permission denied\n"
        b"Traceback (most recent call last):\n"
        b"  partial line without newline"
    )
    assert without_startup_noise(captured) == (
        b"E0000 00:00:1796121933.715640   31249 some_kernel.cc:12] could not open model.pb: permission denied\n"
        b"Traceback (most recent call last):\n"
        b"  partial line without newline"
    )
