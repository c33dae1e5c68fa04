"""Issue 34, item 11: recalibrated statistics are the population statistics of the data given, whatever the batch.

Each BatchNorm's new mean and variance are those of its input over every sample, with the layers before it in eval mode
on their new statistics: a NumPy oracle (a conv + BatchNorm chain with a shortcut, computed in float64 from the
model's weights) holds every framework to that, whether the program takes batches of exactly 4 or any batch. On the
models of the issue (a transformers ResNet exported at a static batch of 4, and a RegNet with squeeze-excitation
blocks), `drift` on the very data a version was recalibrated on reads no shift: the statistics are its own fixed point.
Before the fix the statistics were an average over batches of train-mode forwards, which depends on the batch size.
"""

from __future__ import annotations

import json
import logging
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn
from typer.testing import CliRunner

from converters.models.monitoring.drift import drift_check
from converters.models.monitoring.recalibration import recalibrate
from schemas import UnsupportedObjectError
from tests.real_norms import randomise

warnings.filterwarnings("ignore", message=".*LeafSpec.*")
logging.getLogger("torch.onnx").setLevel(logging.ERROR)

BATCH = torch.export.Dim("batch", min=1, max=1024)


@pytest.fixture(autouse=True)
def _one_thread():
    """These tensors are tiny: on a shared CPU one intra-op thread runs them several times faster than two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


LAYERS = ("bn1", "bn2", "bn_s", "bn3")


class Chain(nn.Module):
    """conv-BN-ReLU, then a block whose two BatchNorms (bn2, then bn3) run beside a strided shortcut's (bn_s)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.conv1, self.bn1 = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6)
        self.conv2, self.bn2 = nn.Conv2d(6, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv3, self.bn3 = nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8, eps=1e-3)
        self.short, self.bn_s = nn.Conv2d(6, 8, 1, stride=2, bias=False), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(h)))
        y = self.bn3(self.conv3(y)) + self.bn_s(self.short(h))
        return self.head(torch.relu(y).mean(dim=(2, 3)))


# -- the NumPy oracle -------------------------------------------------------------------------------------------------


def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int = 1, pad: int = 0) -> np.ndarray:
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out_h, out_w = (x.shape[2] - w.shape[2]) // stride + 1, (x.shape[3] - w.shape[3]) // stride + 1
    out = np.zeros((x.shape[0], w.shape[0], out_h, out_w))
    for i in range(w.shape[2]):
        for j in range(w.shape[3]):
            patch = x[:, :, i : i + stride * out_h : stride, j : j + stride * out_w : stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out if b is None else out + b[None, :, None, None]


def _population(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and unbiased variance per channel over every sample and position (PyTorch's running_var convention)."""
    n = z.shape[0] * z.shape[2] * z.shape[3]
    return z.mean(axis=(0, 2, 3)), z.var(axis=(0, 2, 3)) * n / (n - 1)


def _bn(z: np.ndarray, stats, layer: nn.BatchNorm2d) -> np.ndarray:
    mean, var = stats
    gamma, beta = (p.detach().double().numpy()[None, :, None, None] for p in (layer.weight, layer.bias))
    return (z - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + layer.eps) * gamma + beta


def oracle(model: Chain, x: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each layer's population statistics, each computed with the layers before it in eval mode on theirs."""
    w = {name: p.detach().double().numpy() for name, p in model.named_parameters()}
    x = x.astype(np.float64)
    stats = {}
    z1 = _conv(x, w["conv1.weight"], w["conv1.bias"], pad=1)
    stats["bn1"] = _population(z1)
    h = np.maximum(_bn(z1, stats["bn1"], model.bn1), 0)
    z2, zs = _conv(h, w["conv2.weight"], None, stride=2, pad=1), _conv(h, w["short.weight"], None, stride=2)
    stats["bn2"], stats["bn_s"] = _population(z2), _population(zs)
    z3 = _conv(np.maximum(_bn(z2, stats["bn2"], model.bn2), 0), w["conv3.weight"], None)
    stats["bn3"] = _population(z3)
    return stats


@pytest.fixture(scope="module")
def chain() -> Chain:
    return randomise(Chain(), seed=3)


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return (np.random.default_rng(4).standard_normal((40, 3, 8, 8)) * 1.5 + 0.7).astype(np.float32)


@pytest.fixture(scope="module")
def expected(chain, data):
    return oracle(chain, data)


def _assert_oracle(found: dict[str, tuple[np.ndarray, np.ndarray]], expected, what: str) -> None:
    for name in LAYERS:
        np.testing.assert_allclose(
            found[name][0], expected[name][0], rtol=2e-5, atol=2e-6, err_msg=f"{what}: {name} mean"
        )
        np.testing.assert_allclose(
            found[name][1], expected[name][1], rtol=2e-5, atol=2e-6, err_msg=f"{what}: {name} variance"
        )


def test_the_oracle_is_what_the_recalibrated_torch_model_computes_in_eval(chain, data, expected):
    """The oracle's reading, checked once against torch itself: hooks on a module holding the oracle's statistics see
    inputs whose population statistics are those statistics."""
    held = randomise(Chain(), seed=3)
    for name in LAYERS:
        held.get_submodule(name).running_mean.copy_(torch.from_numpy(expected[name][0]))
        held.get_submodule(name).running_var.copy_(torch.from_numpy(expected[name][1]))
    seen = {}

    def reads(name):
        def hook(_module, args):
            seen[name] = args[0].double().numpy()

        return hook

    handles = [held.get_submodule(n).register_forward_pre_hook(reads(n)) for n in LAYERS]
    with torch.no_grad():
        held(torch.from_numpy(data))
    for handle in handles:
        handle.remove()
    _assert_oracle({n: _population(seen[n]) for n in LAYERS}, expected, "torch in eval on the oracle's statistics")


def test_torch_module_and_programs_at_any_batch_recalibrate_to_the_numpy_population_statistics(chain, data, expected):
    module, _ = recalibrate(chain, data, batch_size=8)
    _assert_oracle(
        {
            n: (
                module.get_buffer(f"{n}.running_mean").double().numpy(),
                module.get_buffer(f"{n}.running_var").double().numpy(),
            )
            for n in LAYERS
        },
        expected,
        "nn.Module",
    )
    static = torch.export.export(chain, (torch.from_numpy(data[:4]),))  # the default: a batch of exactly 4
    dynamic = torch.export.export(chain, (torch.from_numpy(data[:4]),), dynamic_shapes=({0: BATCH},))
    for what, program, batch_size in (("static batch 4", static, 64), ("dynamic batch, uneven batches", dynamic, 16)):
        new, report = recalibrate(program, data, batch_size=batch_size)
        state = new.state_dict
        _assert_oracle(
            {
                n: (state[f"{n}.running_mean"].double().numpy(), state[f"{n}.running_var"].double().numpy())
                for n in LAYERS
            },
            expected,
            what,
        )
        assert report.samples == 40
    assert report.batches == 3  # 16 + 16 + 8
    assert torch.equal(static.state_dict["bn3.running_var"], chain.bn3.running_var)  # the input program is untouched


def test_onnx_recalibrates_to_the_numpy_population_statistics(chain, data, expected):
    exported = torch.onnx.export(
        chain, (torch.from_numpy(data[:4]),), dynamo=True, dynamic_shapes=({0: BATCH},), optimize=False, verbose=False
    ).model_proto
    new, report = recalibrate(exported, data, batch_size=16)
    stored = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in new.graph.initializer}
    _assert_oracle({n: (stored[f"{n}.running_mean"], stored[f"{n}.running_var"]) for n in LAYERS}, expected, "onnx")
    assert [n.SerializeToString() for n in new.graph.node] == [n.SerializeToString() for n in exported.graph.node]
    assert {layer.name for layer in report.layers} == set(LAYERS)


def _keras_chain(model: Chain):
    """The channels-last Keras twin of Chain, with its weights and BatchNorm states."""
    import keras

    def kernel(conv):
        return conv.weight.detach().numpy().transpose(2, 3, 1, 0)

    def bn(name):
        layer = model.get_submodule(name)
        return keras.layers.BatchNormalization(epsilon=layer.eps, name=name)

    inputs = keras.Input((8, 8, 3))
    conv1 = keras.layers.Conv2D(6, 3, padding="same", name="conv1")
    h = keras.layers.ReLU()(bn("bn1")(conv1(inputs)))
    conv2 = keras.layers.Conv2D(8, 3, strides=2, use_bias=False, name="conv2")
    y = keras.layers.ReLU()(bn("bn2")(conv2(keras.layers.ZeroPadding2D(1)(h))))
    conv3, short = (
        keras.layers.Conv2D(8, 1, use_bias=False, name="conv3"),
        keras.layers.Conv2D(8, 1, strides=2, use_bias=False, name="short"),
    )
    y = keras.layers.Add()([bn("bn3")(conv3(y)), bn("bn_s")(short(h))])
    twin = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(y))))
    conv1.set_weights([kernel(model.conv1), model.conv1.bias.detach().numpy()])
    for name in ("conv2", "conv3", "short"):
        twin.get_layer(name).set_weights([kernel(getattr(model, name))])
    for name in LAYERS:
        layer = model.get_submodule(name)
        twin.get_layer(name).set_weights(
            [t.detach().numpy() for t in (layer.weight, layer.bias, layer.running_mean, layer.running_var)]
        )
    return twin


def test_keras_recalibrates_to_the_numpy_population_statistics_and_leaves_weights_alone(chain, data, expected):
    twin = _keras_chain(chain)
    before = [w.copy() for w in twin.get_weights()]
    new, report = recalibrate(twin, data.transpose(0, 2, 3, 1), batch_size=16)
    found = {
        n: (
            np.asarray(new.get_layer(n).moving_mean.numpy(), np.float64),
            np.asarray(new.get_layer(n).moving_variance.numpy(), np.float64),
        )
        for n in LAYERS
    }
    _assert_oracle(found, expected, "keras")
    assert all(np.array_equal(a, b) for a, b in zip(twin.get_weights(), before))  # the input model is untouched
    for name in ("conv1", "conv2", "conv3", "short"):
        for a, b in zip(new.get_layer(name).get_weights(), twin.get_layer(name).get_weights()):
            assert np.array_equal(a, b)
    assert "population statistics" in report.method


def _transformers_resnet():
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    config = ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16, 32, 32], depths=[1, 1, 1, 1], layer_type="basic"
    )
    return randomise(ResNetModel(config), seed=1)


def test_a_transformers_resnet_exported_at_batch_4_is_recalibrated_to_what_drift_then_reads_on_the_same_data(
    tmp_path, cli_app
):
    """The issue's reproduction: `recalibrate v2.pt2 indist.npy -o v3.pt2 --batch-size 64` on a program that takes
    batches of exactly 4, then `drift v3.pt2 indist.npy`: no layer moves (it read a shift of 0.685 in a deep layer), and
    the statistics are those a dynamic-batch export of the same model gets."""
    model = _transformers_resnet()
    x = torch.from_numpy(np.zeros((4, 3, 32, 32), np.float32))
    torch.export.save(torch.export.export(model, (x,)), tmp_path / "v2.pt2")
    torch.export.save(torch.export.export(model, (x,), dynamic_shapes=({0: BATCH},)), tmp_path / "any.pt2")
    np.save(
        tmp_path / "indist.npy",
        (np.random.default_rng(5).standard_normal((64, 3, 32, 32)) * 1.3 + 0.4).astype(np.float32),
    )
    runner = CliRunner()
    done = runner.invoke(
        cli_app,
        [
            "recalibrate",
            str(tmp_path / "v2.pt2"),
            str(tmp_path / "indist.npy"),
            "-o",
            str(tmp_path / "v3.pt2"),
            "--batch-size",
            "64",
            "--json",
        ],
    )
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["batches"] == 16 and "batches of exactly 4" in report["notes"][0]
    drift = runner.invoke(cli_app, ["drift", str(tmp_path / "v3.pt2"), str(tmp_path / "indist.npy"), "--json"])
    assert drift.exit_code == 0, drift.output
    layers = json.loads(drift.output)["layers"]
    assert len(layers) == 12
    # the mean is the data's own; the variance differs from the population variance only by n/(n-1) (64 values at 1x1)
    assert max(layer["max_shift"] for layer in layers) < 1e-4, layers
    assert max(layer["max_abs_log_ratio"] for layer in layers) <= np.log(64 / 63) + 1e-4, layers
    assert (
        runner.invoke(
            cli_app,
            [
                "recalibrate",
                str(tmp_path / "any.pt2"),
                str(tmp_path / "indist.npy"),
                "-o",
                str(tmp_path / "any3.pt2"),
                "--batch-size",
                "64",
            ],
        ).exit_code
        == 0
    )
    static, dynamic = (
        torch.export.load(tmp_path / "v3.pt2").state_dict,
        torch.export.load(tmp_path / "any3.pt2").state_dict,
    )
    for name, value in static.items():
        if name.endswith("num_batches_tracked"):
            continue  # counts the forward passes (16 of 4 against 1 of 64): history, not statistics
        np.testing.assert_allclose(
            value.detach().double().numpy(), dynamic[name].detach().double().numpy(), rtol=2e-5, atol=1e-6, err_msg=name
        )


def test_a_regnet_with_squeeze_excitation_at_a_static_batch_is_its_own_fixed_point_and_agrees_with_its_module():
    """Another member of the family: a transformers RegNet (Y blocks: a squeeze-excitation gate between BatchNorms)."""
    from transformers import RegNetConfig, RegNetModel

    torch.manual_seed(0)
    config = RegNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16, 32], depths=[1, 1, 1], groups_width=4, layer_type="y"
    )
    model = randomise(RegNetModel(config), seed=2)
    data = (np.random.default_rng(6).standard_normal((32, 3, 32, 32)) * 0.8 - 0.3).astype(np.float32)
    program = torch.export.export(model, (torch.from_numpy(data[:4]),))
    new, _ = recalibrate(program, data, batch_size=32, variance_estimator="biased")
    report = drift_check(new, data)
    assert len(report.layers) == 13 and report.verdict == "no drift"
    assert max(layer.max_shift for layer in report.layers) < 1e-4
    assert max(layer.max_abs_log_ratio for layer in report.layers) < 1e-4  # biased: the population variance itself
    module, _ = recalibrate(model, data, batch_size=32, variance_estimator="biased")
    for name, value in new.state_dict.items():
        if name.endswith(("running_mean", "running_var")):
            np.testing.assert_allclose(
                value.double().numpy(), module.get_buffer(name).double().numpy(), rtol=2e-5, atol=1e-6, err_msg=name
            )


def test_a_batchnorm_shared_by_two_branches_pools_both_uses_in_a_program_and_is_refused_in_a_module():
    """A module cannot show whether the uses of a shared BatchNorm feed one another; its program's graph does."""

    class Siamese(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(2)
            self.left, self.right, self.bn = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.left(x)) + self.bn(self.right(x))

    model = randomise(Siamese(), seed=5)
    data = np.random.default_rng(7).standard_normal((12, 3, 4, 4)).astype(np.float32)
    with pytest.raises(
        UnsupportedObjectError, match=r"layer 'bn' runs 2 times per forward .* recalibrate its torch.export program"
    ):
        recalibrate(model, data)
    new, _ = recalibrate(torch.export.export(model, (torch.from_numpy(data[:4]),)), data, variance_estimator="biased")
    with torch.no_grad():
        both = torch.cat([model.left(torch.from_numpy(data)), model.right(torch.from_numpy(data))]).double().numpy()
    np.testing.assert_allclose(
        new.state_dict["bn.running_mean"].double().numpy(), both.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        new.state_dict["bn.running_var"].double().numpy(), both.var(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6
    )
