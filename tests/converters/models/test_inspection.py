"""inspect_model and `normbridge inspect` on real torch modules, .pt2 programs, .keras files and ONNX exports."""

from __future__ import annotations

import json
import pickle
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from converters.torch_adapter.recognition.exported_program import exported_norm_layers, exported_specs
from converters.models.inspection import inspect_model, inspect_path
from converters.models.walking import norm_layers, spec_of
from schemas import spec_differences
from schemas.inspection import ModelInspection
from schemas.tensors import tensors_identical
from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli

BN_PATHS = ["block1.1", "block2.1", "block3.1"]


class SmallCNN(nn.Module):
    """Three Conv-BN-ReLU blocks and a LayerNorm head; block1's BN is a cumulative average, block2's has eps 1e-3."""

    def __init__(self):
        super().__init__()
        self.block1 = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8, momentum=None), nn.ReLU()
        )
        self.block2 = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8, eps=1e-3), nn.ReLU())
        self.block3 = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = self.block3(self.block2(self.block1(x)))
        return self.fc(self.head(x.mean(dim=(2, 3))))


def trained_cnn(seed: int = 0) -> SmallCNN:
    """block1 and block2 see data in train mode; block3's BN is kept in eval, so its statistics stay untouched."""
    torch.manual_seed(seed)
    net = SmallCNN().train()
    net.block3[1].eval()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(4, 3, 8, 8) * 2 + 0.5)
    return net.eval()


def example() -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, 8, 8),)


def export(module: nn.Module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(module, example())


def by_path(inspection: ModelInspection) -> dict:
    return {layer.path: layer for layer in inspection.layers}


def codes(layer) -> set[str]:
    return {h.code for h in layer.hazards}


# -- torch.nn.Module ---------------------------------------------------------------------


def test_module_statistics_match_numpy_and_only_the_untouched_layer_is_never_trained():
    net = trained_cnn()
    inspection = inspect_model(net)
    assert [layer.path for layer in inspection.layers] == BN_PATHS + ["head"]
    layers = by_path(inspection)
    for path in BN_PATHS:
        bn = net.get_submodule(path)
        mean, var = bn.running_mean.numpy().astype(np.float64), bn.running_var.numpy().astype(np.float64)
        stats = layers[path].stats
        assert (stats.mean_min, stats.mean_mean, stats.mean_max) == (mean.min(), mean.mean(), mean.max())
        assert (stats.var_min, stats.var_mean, stats.var_max) == (var.min(), var.mean(), var.max())
        assert stats.num_batches_tracked == int(bn.num_batches_tracked)
        assert layers[path].mode == "eval" and layers[path].spec["eps"] == bn.eps
    assert [layers[p].stats.updated for p in BN_PATHS] == [True, True, False]
    assert [p for p, layer in layers.items() if "never_trained" in codes(layer)] == ["block3.1"]
    assert layers["head"].stats is None and layers["head"].mode == "n/a" and layers["head"].kind == "layer"
    assert inspection.worst_severity() == "warning" and not inspection.has_hazard_at_least("error")


def test_eps_not_default_is_info_for_eps_1e_3_only_and_names_both_values():
    layers = by_path(inspect_model(trained_cnn()))
    flagged = [p for p, layer in layers.items() if "eps_not_default" in codes(layer)]
    assert flagged == ["block2.1"]
    hazard = next(h for h in layers["block2.1"].hazards if h.code == "eps_not_default")
    assert hazard.severity == "info" and "0.001" in hazard.message and "1e-05" in hazard.message


def test_a_layer_left_in_train_mode_is_an_error():
    net = trained_cnn()
    net.block2.train()
    layers = by_path(inspect_model(net))
    assert layers["block2.1"].mode == "train"
    assert {p for p, layer in layers.items() if "train_mode" in codes(layer)} == {"block2.1"}
    hazard = next(h for h in layers["block2.1"].hazards if h.code == "train_mode")
    assert hazard.severity == "error" and "eval()" in hazard.message


def test_momentum_none_and_untracked_statistics_are_flagged_but_untracked_instance_norm_is_not():
    net = nn.Sequential(
        nn.Conv2d(3, 4, 1),
        nn.BatchNorm2d(4, momentum=None),
        nn.BatchNorm2d(4, track_running_stats=False),
        nn.InstanceNorm2d(4),
    )
    with torch.no_grad():
        net.train()(torch.randn(4, 3, 5, 5))
    layers = by_path(inspect_model(net.eval()))
    assert codes(layers["1"]) == {"momentum_none"}
    assert (
        "num_batches_tracked=1" in layers["1"].hazards[0].message
        and layers["1"].momentum_text() == "None (cumulative average)"
    )
    assert codes(layers["2"]) == {"batch_stats_at_eval"} and layers["2"].hazards[0].severity == "error"
    assert layers["2"].stats is None
    assert codes(layers["3"]) == set() and layers["3"].mode == "n/a"


def test_a_layer_whose_state_cannot_be_read_is_listed_with_the_reason():
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.LayerNorm(4)).eval()
    with torch.no_grad():
        net[1].running_var[2] = float("nan")
    layers = inspect_model(net).layers
    assert [(layer.path, layer.spec is None) for layer in layers] == [("1", True), ("2", False)]
    assert codes(layers[0]) == {"unreadable"} and "running_var" in layers[0].hazards[0].message


# -- ExportedProgram (.pt2) --------------------------------------------------------------


@pytest.fixture(scope="module")
def cnn_and_pt2(tmp_path_factory):
    net = trained_cnn()
    path = tmp_path_factory.mktemp("pt2") / "cnn.pt2"
    torch.export.save(export(net), str(path))
    return net, path


def module_specs(net: nn.Module) -> list:
    return [spec_of(ref) for ref in norm_layers(net)]


def assert_same_specs(module_side: list, program_side: list) -> None:
    assert [s.name for s in program_side] == [s.name for s in module_side]
    for ours, theirs in zip(module_side, program_side):
        # source and input_rank say where a spec was read from; everything the layer computes must agree.
        assert spec_differences(ours, theirs) == [], ours.name
        assert (theirs.eps, theirs.momentum, theirs.momentum_convention) == (
            ours.eps,
            ours.momentum,
            ours.momentum_convention,
        )
        assert set(theirs.tensors) == set(ours.tensors)
        assert all(tensors_identical(theirs.tensors[k], ours.tensors[k]) for k in ours.tensors)


def test_pt2_file_reads_to_the_same_specs_as_the_module(cnn_and_pt2):
    net, path = cnn_and_pt2
    program = torch.export.load(str(path))
    specs = exported_specs(program)
    assert_same_specs(module_specs(net), specs)
    assert specs[0].momentum is None and specs[1].eps == 1e-3  # momentum=None survives as the eval op's 0.0
    assert specs[0].source.layer_type == "aten.batch_norm.default" and specs[0].input_rank == 4
    inspection = inspect_path(path)
    assert inspection.framework == "torch" and {layer.origin for layer in inspection.layers} == {"exported_program"}
    assert [codes(layer) for layer in inspection.layers] == [
        {"momentum_none"},
        {"eps_not_default", "unconverged_statistics"},
        {"never_trained"},
        set(),
    ]
    module_view = inspect_model(net)
    assert [layer.stats for layer in inspection.layers] == [layer.stats for layer in module_view.layers]


def test_decomposed_program_still_reads_batch_and_layer_norms(cnn_and_pt2):
    net, path = cnn_and_pt2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.load(str(path)).run_decompositions()
    layers = exported_norm_layers(program)
    assert [layer.op for layer in layers] == ["aten._native_batch_norm_legit_no_training.default"] * 3 + [
        "aten.native_layer_norm.default"
    ]
    assert_same_specs(module_specs(net), [layer.spec for layer in layers])


def test_program_exported_in_train_mode_is_flagged():
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LayerNorm(144), nn.RMSNorm(144)
    )
    program = export(net.train())
    inspection = inspect_model(program)
    layers = by_path(inspection)
    assert layers["1"].mode == "train" and codes(layers["1"]) == {"train_mode", "never_trained"}
    assert layers["4"].mode == "n/a" and codes(layers["4"]) == set()
    assert (
        layers["5"].spec["eps_origin"] == "dtype_eps" and codes(layers["5"]) == set()
    )  # RMSNorm(eps=None) is the default
    assert inspection.has_hazard_at_least("error")
    # run_decompositions dissolves RMSNorm into primitive ops: still listed, from its module metadata, as unreadable.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        decomposed = by_path(inspect_model(program.run_decompositions()))
    assert decomposed["1"].spec["training"] and "train_mode" in codes(decomposed["1"])
    assert (decomposed["5"].kind, decomposed["5"].native, decomposed["5"].spec) == ("rms", False, None)
    assert codes(decomposed["5"]) == {"decomposed"} and decomposed["5"].hazards[0].severity == "warning"


# -- Keras -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keras_files(tmp_path_factory):
    from converters.keras_adapter.runtime import import_keras

    keras = import_keras()
    folder = tmp_path_factory.mktemp("keras")
    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input((6, 6, 3)),
            layers.Conv2D(4, 3, name="conv"),
            layers.BatchNormalization(name="bn"),
            layers.LayerNormalization(epsilon=1e-5, name="ln"),
            layers.GroupNormalization(groups=2, name="gn"),
        ]
    )
    model(np.random.default_rng(0).normal(1.0, 2.0, (8, 6, 6, 3)).astype("float32"), training=True)
    model.save(folder / "model.keras")
    with_lambda = keras.Sequential([keras.Input((4,)), layers.Lambda(lambda x: x * 2.0), layers.BatchNormalization()])
    with_lambda.save(folder / "lambda.keras")
    return model, folder / "model.keras", folder / "lambda.keras"


def test_keras_file_is_inspected_in_layer_order_with_its_statistics(keras_files):
    model, path, _ = keras_files
    inspection = inspect_path(path)
    assert inspection.framework == "keras"
    assert [(layer.path, layer.kind) for layer in inspection.layers] == [
        ("bn", "batch"),
        ("ln", "layer"),
        ("gn", "group"),
    ]
    bn = model.get_layer("bn")
    mean, var = np.asarray(bn.moving_mean.numpy(), np.float64), np.asarray(bn.moving_variance.numpy(), np.float64)
    stats = inspection.layers[0].stats
    assert (stats.mean_min, stats.mean_mean, stats.mean_max, stats.var_max) == (
        mean.min(),
        mean.mean(),
        mean.max(),
        var.max(),
    )
    assert stats.updated and stats.num_batches_tracked is None and inspection.layers[0].mode == "n/a"
    assert (
        inspection.layers[0].spec["momentum"] == 0.99
        and inspection.layers[0].spec["momentum_convention"] == "running_weight"
    )
    assert [codes(layer) for layer in inspection.layers] == [set(), {"eps_not_default"}, set()]
    assert "Keras's default 0.001" in inspection.layers[1].hazards[0].message


def test_keras_export_through_tf2onnx_shows_a_folded_batch_norm_and_decomposed_layer_norm(tmp_path):
    from converters.keras_adapter.runtime import import_keras

    keras = import_keras()
    model = keras.Sequential(
        [
            keras.Input((5, 3)),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.LayerNormalization(epsilon=1e-5, name="ln"),
        ]
    )
    model(np.random.default_rng(1).normal(size=(4, 5, 3)).astype("float32"), training=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.export(str(tmp_path / "k.onnx"), format="onnx", verbose=False)
    bn, ln = inspect_path(tmp_path / "k.onnx").layers
    assert (bn.kind, bn.native, bn.folded, bn.spec, bn.eps) == ("batch", False, True, None, None)
    assert codes(bn) == {"folded_batchnorm"} and "recalibrated" in bn.hazards[0].message
    assert (ln.kind, ln.native, ln.origin, ln.eps) == ("layer", False, "tf2onnx", 1e-5)
    assert codes(ln) == {"decomposed", "eps_not_default"}
    messages = " ".join(h.message for h in ln.hazards)
    assert "tf2onnx" in messages and "eps=1e-05" in messages and "Keras's default 0.001" in messages


def test_keras_resnet50_is_inspected_with_every_batch_norm_never_trained():
    from converters.keras_adapter.runtime import import_keras

    model = import_keras().applications.ResNet50(weights=None, input_shape=(64, 64, 3))
    inspection = inspect_model(model)
    assert len(inspection.layers) == 53 and {layer.kind for layer in inspection.layers} == {"batch"}
    assert all("never_trained" in codes(layer) for layer in inspection.layers)
    # keras.applications builds its BatchNorms with epsilon=1.001e-5, not Keras's 1e-3.
    assert {layer.spec["eps"] for layer in inspection.layers} == {1.001e-5}


# -- ONNX --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_files(cnn_and_pt2, tmp_path_factory):
    net, _ = cnn_and_pt2
    folder = tmp_path_factory.mktemp("onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, example(), str(folder / "kept.onnx"), dynamo=True, optimize=False, external_data=False, verbose=False
        )
        torch.onnx.export(net, example(), str(folder / "folded.onnx"), dynamo=True, external_data=False, verbose=False)
    return net, folder / "kept.onnx", folder / "folded.onnx"


def test_onnx_export_has_native_batch_norm_sites_equal_to_the_source(onnx_files):
    net, kept, _ = onnx_files
    inspection = inspect_path(kept)
    batch = [layer for layer in inspection.layers if layer.kind == "batch"]
    assert len(batch) == 3 and all(
        layer.native and layer.origin == "native" and layer.mode == "eval" for layer in batch
    )
    for layer, path in zip(batch, BN_PATHS):
        bn = net.get_submodule(path)
        assert layer.spec["eps"] == bn.eps
        mean, var = bn.running_mean.numpy().astype(np.float64), bn.running_var.numpy().astype(np.float64)
        assert (layer.stats.mean_min, layer.stats.mean_max, layer.stats.var_min, layer.stats.var_max) == (
            mean.min(),
            mean.max(),
            var.min(),
            var.max(),
        )
    assert [layer.spec["eps"] == 1e-3 for layer in batch] == [False, True, False]
    assert "never_trained" in codes(batch[2]) and "never_trained" not in codes(batch[0])
    assert any(layer.kind == "layer" for layer in inspection.layers)
    assert not [h for h in inspection.hazards if h.code == "folded_batchnorm"]


def test_onnx_export_with_batch_norm_folded_into_conv_says_so(onnx_files):
    _, _, folded = onnx_files
    inspection = inspect_path(folded)
    assert not [layer for layer in inspection.layers if layer.kind == "batch"]
    hazard = next(h for h in inspection.hazards if h.code == "folded_batchnorm")
    assert hazard.severity == "warning" and "Conv" in hazard.message and "recalibrated" in hazard.message


# -- the command line ----------------------------------------------------------------------


def process(*args: str) -> subprocess.CompletedProcess:
    """`normbridge ARGS` in a new process."""
    return subprocess.run(normbridge_command() + list(args), capture_output=True, text=True, timeout=300)


def run(*args: str) -> subprocess.CompletedProcess:
    """`normbridge ARGS` in this process (the console script's app through CliRunner)."""
    return invoke_cli(*args, cwd=Path.cwd())


#: Formats whose table and JSON also come from a real process; every format runs in-process.
PROCESS_FORMATS = ("pt2",)


@pytest.fixture(scope="module")
def cli_files(cnn_and_pt2, keras_files, onnx_files):
    return {"pt2": cnn_and_pt2[1], "keras": keras_files[1], "onnx": onnx_files[1]}


FORMATS = {"pt2": ("block1.1", "torch"), "keras": ("bn", "keras"), "onnx": (None, "onnx")}


@pytest.mark.slow
@pytest.mark.parametrize("fmt, how", [(f, "in-process") for f in FORMATS] + [(f, "process") for f in PROCESS_FORMATS])
def test_cli_prints_the_table_and_valid_json(cli_files, fmt, how):
    first_path, framework = FORMATS[fmt]
    run_as = process if how == "process" else run
    path = cli_files[fmt]
    table = run_as("inspect", str(path))
    assert table.returncode == 0, table.stdout + table.stderr
    assert (
        "eps" in table.stdout and "momentum" in table.stdout and "hazards" in table.stdout and "batch" in table.stdout
    )
    as_json = run_as("inspect", str(path), "--json")
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    inspection = ModelInspection.model_validate(json.loads(as_json.stdout))
    assert inspection.framework == framework and inspection.source == str(path) and inspection.layers
    if first_path is not None:
        assert inspection.layers[0].path == first_path and first_path in table.stdout


@pytest.mark.slow
def test_cli_fail_on_error_exits_10_on_a_train_mode_export_and_0_without_it(tmp_path):
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    path = tmp_path / "train.pt2"
    torch.export.save(export(net), str(path))
    failed = process("inspect", str(path), "--fail-on", "error", "--json")  # the verdict as a process exit status
    assert failed.returncode == 10, failed.stdout + failed.stderr
    assert "train_mode" in {h["code"] for h in json.loads(failed.stdout)["layers"][0]["hazards"]}
    shown = run("inspect", str(path))
    assert shown.returncode == 0 and "train_mode" in shown.stdout and "model.eval()" in shown.stdout


@pytest.mark.slow
def test_cli_fail_on_error_passes_an_eval_export_with_warnings_only(cli_files):
    done = run("inspect", str(cli_files["pt2"]), "--fail-on", "error")
    assert done.returncode == 0, done.stdout + done.stderr
    assert run("inspect", str(cli_files["pt2"]), "--fail-on", "warning").returncode == 10


@pytest.mark.slow
def test_cli_refuses_a_pickle_and_a_keras_file_with_a_lambda(tmp_path, keras_files):
    pickled = tmp_path / "model.pth"
    pickled.write_bytes(pickle.dumps({"state": 1}))
    done = run("inspect", str(pickled))
    assert done.returncode == 6 and "can execute code" in done.stderr
    refused = run("inspect", str(keras_files[2]))
    assert refused.returncode == 6 and "safe_mode" in refused.stderr and "Lambda" in refused.stderr


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_16_bit_rmsnorm_with_eps_none_reads_from_a_program_as_the_float32_eps_torch_adds(dtype):
    """torch computes a 16-bit RMSNorm in float32 and adds float32's eps (NumPy's number here),
    not the layer dtype's."""
    net = nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8)).to(dtype).eval()
    program = torch.export.export(net, (torch.randn(2, 8, dtype=dtype),))
    layer = by_path(inspect_model(program))["1"]
    assert layer.spec["eps"] == float(np.finfo(np.float32).eps) and layer.spec["eps_origin"] == "dtype_eps"
    assert "eps_not_default" not in codes(layer)


def test_a_frozen_batchnorm_says_frozen_not_a_momentum():
    """torchvision's FrozenBatchNorm2d (replica) never updates its statistics: its momentum reads 'frozen', where a
    BatchNorm2d with momentum=None reads as the cumulative average it is (issue 35)."""
    from tests.real_norms import FrozenBatchNorm2d

    frozen = nn.Sequential(nn.Conv2d(3, 4, 3), FrozenBatchNorm2d(4)).eval()
    cumulative = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=None)).eval()
    [frozen_layer] = inspect_model(frozen).layers
    [cumulative_layer] = inspect_model(cumulative).layers
    assert frozen_layer.momentum_text() == "frozen (never updates)"
    assert cumulative_layer.momentum_text() == "None (cumulative average)"
