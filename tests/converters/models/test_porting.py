"""Porting normalization state between twin models, against real torch, Keras and onnxruntime-free ONNX graphs.

The twins come from testkit/model_zoo.py. Non-normalization weights are copied by the zoo's
helpers (with the OIHW <-> HWIO transposes); normalization state moves only through
port_state, so equal whole-model outputs show that the port carried everything that matters
at inference, and the per-layer checks show it carried it exactly.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch

from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli

keras = pytest.importorskip("keras")

from converters import markers
from converters.models.porting import PortMismatchError, port_state
from schemas import NotExpressibleError
from schemas.floats import decimal_complement
from schemas.tensors import tensors_identical

from testkit import model_zoo as zoo

ATOL = 1e-4
RESNET_INPUT = (4, 3, 32, 32)
#: Layers given non-default settings before training: (torch path, eps, momentum).
CUSTOM_BN = (("stem.1", 1e-3, 0.01), ("layer1.1.bn2", 1e-3, 0.01), ("layer2.0.downsample.1", 2e-4, 0.3))


def nhwc(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def random_input(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def torch_out(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def keras_out(model, x: np.ndarray) -> np.ndarray:
    return np.asarray(model(x, training=False))


def keras_state(model) -> dict[str, np.ndarray]:
    return {v.path: np.array(v.numpy(), copy=True) for v in model.weights}


def keras_settings(model) -> dict[str, tuple]:
    return {
        layer.name: (layer.epsilon, getattr(layer, "momentum", None))
        for layer in model.layers
        if hasattr(layer, "epsilon")
    }


def assert_keras_unchanged(model, state, settings):
    after = keras_state(model)
    assert after.keys() == state.keys()
    assert all(tensors_identical(state[k], after[k]) for k in state), [
        k for k in state if not tensors_identical(state[k], after[k])
    ]
    assert keras_settings(model) == settings


def trained_torch_resnet() -> torch.nn.Module:
    model = zoo.torch_resnet_small()
    modules = dict(model.named_modules())
    for path, eps, momentum in CUSTOM_BN:
        modules[path].eps, modules[path].momentum = eps, momentum
    generator = torch.Generator().manual_seed(1)
    # Shifted, scaled inputs so the trained statistics are far from the initial (0, 1).
    batches = [torch.randn(RESNET_INPUT, generator=generator) * 2.0 + 0.5 for _ in range(4)]
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5, generator=generator)
                module.bias.uniform_(-0.5, 0.5, generator=generator)
    return zoo.train_batchnorm_statistics(model, batches)


@pytest.fixture(scope="module")
def torch_resnet():
    return trained_torch_resnet()


@pytest.fixture
def keras_twin(torch_resnet):
    model = zoo.keras_resnet_small()
    zoo.copy_torch_weights_to_keras(torch_resnet, model)
    return model


# -- torch ResNet -> Keras twin -----------------------------------------------------------


def test_torch_resnet_into_keras_twin_computes_the_same_and_carries_every_setting(torch_resnet, keras_twin):
    x = random_input(RESNET_INPUT)
    expected = torch_out(torch_resnet, x)
    keras_twin.predict(nhwc(x), verbose=0)  # trace predict() with the old state: the port must invalidate it
    assert np.abs(keras_out(keras_twin, nhwc(x)) - expected).max() > 1e-2  # before the port the twins differ

    report = port_state(torch_resnet, keras_twin)

    np.testing.assert_allclose(keras_out(keras_twin, nhwc(x)), expected, atol=ATOL, rtol=0)
    np.testing.assert_allclose(keras_twin.predict(nhwc(x), verbose=0), expected, atol=ATOL, rtol=0)
    custom = {path: (eps, momentum) for path, eps, momentum in CUSTOM_BN}
    bns = [(p, m) for p, m in torch_resnet.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert [layer.layer for layer in report.layers] == [p for p, _ in bns]
    for (path, module), layer_report in zip(bns, report.layers):
        layer = keras_twin.get_layer(zoo.keras_name(path))
        assert layer.epsilon == module.eps == custom.get(path, (1e-5, None))[0]
        assert layer.momentum == decimal_complement(module.momentum)
        for ours, theirs in (
            ("gamma", module.weight),
            ("beta", module.bias),
            ("moving_mean", module.running_mean),
            ("moving_variance", module.running_var),
        ):
            assert tensors_identical(np.asarray(getattr(layer, ours).numpy()), theirs.detach().numpy()), (path, ours)
        assert markers.recall(layer)["num_batches_tracked"] == 4
        settings = {t.setting: t for t in layer_report.translations}
        assert settings["layer"].target_value == layer.name
        assert settings["eps"].target_value == module.eps and settings["momentum"].target_value == layer.momentum
        assert settings["momentum"].fate == "translated" and settings["variance_estimator"].fate == "approximate"
    stem = keras_twin.get_layer("stem_1")
    assert stem.epsilon == 1e-3 and stem.momentum == 0.99


def test_a_ported_keras_batchnorm_matches_the_numpy_formula(torch_resnet, keras_twin):
    port_state(torch_resnet, keras_twin)
    module, layer = torch_resnet.layer2[0].downsample[1], keras_twin.get_layer("layer2_0_downsample_1")
    x = random_input((3, 5, 5, 32), seed=2) * 3.0
    mean, var, weight, bias = (
        t.detach().numpy().astype(np.float64)
        for t in (module.running_mean, module.running_var, module.weight, module.bias)
    )
    expected = (x - mean) / np.sqrt(var + 2e-4) * weight + bias
    np.testing.assert_allclose(keras_out(layer, x), expected, atol=1e-5, rtol=1e-5)


def test_the_ported_keras_file_round_trips(torch_resnet, keras_twin, tmp_path):
    port_state(torch_resnet, keras_twin)
    path = tmp_path / "twin.keras"
    keras_twin.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True, compile=False)
    x = random_input(RESNET_INPUT, seed=3)
    np.testing.assert_allclose(keras_out(loaded, nhwc(x)), torch_out(torch_resnet, x), atol=ATOL, rtol=0)
    assert loaded.get_layer("stem_1").epsilon == 1e-3 and loaded.get_layer("stem_1").momentum == 0.99


# -- Keras ResNet -> torch twin -----------------------------------------------------------


def test_keras_resnet_into_torch_twin(tmp_path):
    source = zoo.keras_resnet_small()
    rng = np.random.default_rng(5)
    for index, layer in enumerate(l for l in source.layers if isinstance(l, keras.layers.BatchNormalization)):
        channels = layer.gamma.shape[0]
        layer.gamma.assign(rng.uniform(0.5, 1.5, channels).astype(np.float32))
        layer.beta.assign(rng.uniform(-0.5, 0.5, channels).astype(np.float32))
        layer.moving_mean.assign(rng.uniform(-1.0, 1.0, channels).astype(np.float32))
        layer.moving_variance.assign(rng.uniform(0.5, 3.0, channels).astype(np.float32))
        if index % 3 == 0:
            layer.epsilon, layer.momentum = 2e-3, 0.95
    target = zoo.torch_resnet_small().eval()
    zoo.copy_keras_weights_to_torch(source, target)
    modules_before = {path: id(m) for path, m in target.named_modules()}
    x = random_input(RESNET_INPUT, seed=7)

    report = port_state(source, target)

    np.testing.assert_allclose(torch_out(target, x), keras_out(source, nhwc(x)), atol=ATOL, rtol=0)
    assert {path: id(m) for path, m in target.named_modules()} == modules_before  # written in place, nothing replaced
    for path, module in ((p, m) for p, m in target.named_modules() if isinstance(m, torch.nn.BatchNorm2d)):
        layer = source.get_layer(zoo.keras_name(path))
        assert module.eps == layer.epsilon and module.momentum == decimal_complement(layer.momentum)
        assert module.momentum in (0.05, 0.01) and not module.training
        for ours, theirs in (
            ("weight", layer.gamma),
            ("bias", layer.beta),
            ("running_mean", layer.moving_mean),
            ("running_var", layer.moving_variance),
        ):
            assert tensors_identical(getattr(module, ours).detach().numpy(), np.asarray(theirs.numpy())), (path, ours)
        assert int(module.num_batches_tracked) == 0
    settings = {t.setting: t for t in report.layers[0].translations}
    assert settings["momentum"].source_value == 0.95 and settings["momentum"].target_value == 0.05
    assert settings["num_batches_tracked"].fate == "stored"


# -- transformer block: LayerNorm + RMSNorm ---------------------------------------------------


def randomise_norms(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in (model.norm1, model.norm2):
            module.weight.uniform_(0.5, 1.5, generator=generator)
        model.norm1.bias.uniform_(-0.5, 0.5, generator=generator)


def test_transformer_block_both_directions():
    source = zoo.torch_transformer_block(layer_norm_eps=2e-5, rms_norm_eps=None).eval()
    randomise_norms(source, 11)
    twin = zoo.keras_transformer_block()  # Keras's own defaults: epsilon 1e-3 and 1e-6
    zoo.copy_torch_transformer_weights_to_keras(source, twin)
    x = random_input((3, 8, 32), seed=9) * 2.0
    assert np.abs(keras_out(twin, x) - torch_out(source, x)).max() > 1e-3

    report = port_state(source, twin)

    np.testing.assert_allclose(keras_out(twin, x), torch_out(source, x), atol=ATOL, rtol=0)
    norm1, norm2 = twin.get_layer("norm1"), twin.get_layer("norm2")
    assert norm1.epsilon == 2e-5 and norm2.epsilon == float(torch.finfo(torch.float32).eps)
    assert tensors_identical(np.asarray(norm1.gamma.numpy()), source.norm1.weight.detach().numpy())
    assert tensors_identical(np.asarray(norm1.beta.numpy()), source.norm1.bias.detach().numpy())
    assert tensors_identical(np.asarray(norm2.scale.numpy()), source.norm2.weight.detach().numpy())
    rms = {t.setting: t for t in report.layers[1].translations}
    assert (
        report.layers[1].kind == "rms"
        and rms["eps_origin"].source_value == "dtype_eps"
        and rms["eps_origin"].fate == "stored"
    )

    # Back into a PyTorch block built with other eps values: eps=None comes back from the in-memory marker.
    back = zoo.torch_transformer_block(layer_norm_eps=1e-5, rms_norm_eps=1e-6).eval()
    zoo.copy_keras_transformer_weights_to_torch(twin, back)
    port_state(twin, back)
    assert back.norm1.eps == 2e-5 and back.norm2.eps is None
    np.testing.assert_allclose(torch_out(back, x), torch_out(source, x), atol=ATOL, rtol=0)

    # A Keras block that never saw PyTorch: its explicit epsilon is carried as a number.
    plain = zoo.keras_transformer_block(layer_norm_eps=3e-4, rms_norm_eps=2e-5)
    port_state(plain, back)
    assert back.norm1.eps == 3e-4 and back.norm2.eps == 2e-5


# -- refusals leave the target untouched -----------------------------------------------------


def test_a_count_mismatch_is_refused_naming_the_layer_and_nothing_changes(torch_resnet, keras_twin):
    shorter = keras.Model(keras_twin.input, keras_twin.get_layer("layer2_1_relu1").output)  # without layer2_1_bn2
    state, settings = keras_state(keras_twin), keras_settings(keras_twin)
    with pytest.raises(PortMismatchError) as caught:
        port_state(torch_resnet, shorter)
    message = str(caught.value)
    assert "10 normalization layers" in message and "the target 9" in message and "'layer2.1.bn2'" in message
    assert caught.value.layer == "layer2.1.bn2" and caught.value.setting == "layer_count"
    assert_keras_unchanged(keras_twin, state, settings)


def test_a_shape_mismatch_is_refused_naming_both_layers_and_nothing_changes(keras_twin):
    source = zoo.torch_resnet_small().eval()
    source.layer2[0].bn1 = torch.nn.BatchNorm2d(24)
    state, settings = keras_state(keras_twin), keras_settings(keras_twin)
    with pytest.raises(PortMismatchError) as caught:
        port_state(source, keras_twin)
    message = str(caught.value)
    assert (
        "'layer2.0.bn1'" in message
        and "num_features=24" in message
        and "'layer2_0_bn1'" in message
        and "num_features=32" in message
    )
    assert_keras_unchanged(keras_twin, state, settings)


def test_a_setting_the_last_target_cannot_hold_refuses_before_anything_is_written(torch_resnet, keras_twin):
    source = trained_torch_resnet()
    source.layer2[1].bn2.momentum = None  # cumulative average: Keras has no such momentum
    state, settings = keras_state(keras_twin), keras_settings(keras_twin)
    with pytest.raises(NotExpressibleError) as caught:
        port_state(source, keras_twin)
    assert caught.value.layer == "layer2.1.bn2" and caught.value.setting == "momentum"
    assert_keras_unchanged(keras_twin, state, settings)
    from converters.options import ConversionOptions

    report = port_state(source, keras_twin, options=ConversionOptions(cumulative_momentum="next_step"))
    assert keras_twin.get_layer("layer2_1_bn2").momentum == 1.0 - 1.0 / 5  # 4 batches tracked
    assert any("momentum=None" in w for w in report.warnings)


def test_missing_affine_weights_in_the_target_are_refused_and_extra_ones_become_identities():
    source = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8, eps=1e-4)).eval()
    no_bias = keras.Sequential([keras.Input((4, 8)), keras.layers.LayerNormalization(center=False, name="ln")])
    with pytest.raises(NotExpressibleError) as caught:
        port_state(source, no_bias)
    assert caught.value.layer == "1" and caught.value.setting == "bias" and "center=False" in str(caught.value)
    assert no_bias.get_layer("ln").epsilon == 1e-3

    plain = torch.nn.Sequential(torch.nn.LayerNorm(8, elementwise_affine=False, eps=1e-4))
    full = keras.Sequential([keras.Input((4, 8)), keras.layers.LayerNormalization(name="ln")])
    full.get_layer("ln").gamma.assign(np.full(8, 3.0, np.float32))
    report = port_state(plain, full)
    layer = full.get_layer("ln")
    assert np.all(layer.gamma.numpy() == 1.0) and np.all(layer.beta.numpy() == 0.0) and layer.epsilon == 1e-4
    assert any("identity" in w for w in report.warnings)

    # Into PyTorch: a target without affine parameters or statistics cannot hold a Keras BatchNormalization.
    keras_bn = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(epsilon=1e-2, name="bn")])
    for target, setting in (
        (torch.nn.Sequential(torch.nn.BatchNorm1d(4, affine=False)), "scale"),
        (torch.nn.Sequential(torch.nn.BatchNorm1d(4, track_running_stats=False)), "track_running_stats"),
    ):
        before = {k: v.clone() for k, v in target.state_dict().items()}
        with pytest.raises(NotExpressibleError) as caught:
            port_state(keras_bn, target)
        assert caught.value.layer == "bn" and caught.value.setting == setting
        assert target[0].eps == 1e-5 and all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_name_map_errors_name_the_unknown_layer(torch_resnet, keras_twin):
    state, settings = keras_state(keras_twin), keras_settings(keras_twin)
    with pytest.raises(PortMismatchError, match="'layer9.bn'"):
        port_state(torch_resnet, keras_twin, {"layer9.bn": "stem_1"})
    with pytest.raises(PortMismatchError, match="'no_such_layer'"):
        port_state(torch_resnet, keras_twin, {"stem.1": "no_such_layer"})
    assert_keras_unchanged(keras_twin, state, settings)


def test_a_name_map_that_swaps_two_same_shape_layers_is_honoured(torch_resnet, keras_twin):
    swap = {"layer1.0.bn1": "layer1_0_bn2", "layer1.0.bn2": "layer1_0_bn1"}
    report = port_state(torch_resnet, keras_twin, swap)
    bn1, bn2 = torch_resnet.layer1[0].bn1, torch_resnet.layer1[0].bn2
    assert tensors_identical(
        np.asarray(keras_twin.get_layer("layer1_0_bn2").moving_mean.numpy()), bn1.running_mean.numpy()
    )
    assert tensors_identical(
        np.asarray(keras_twin.get_layer("layer1_0_bn1").moving_mean.numpy()), bn2.running_mean.numpy()
    )
    assert not np.array_equal(bn1.running_mean.numpy(), bn2.running_mean.numpy())
    pairing = {r.layer: next(t for t in r.translations if t.setting == "layer") for r in report.layers}
    assert pairing["layer1.0.bn1"].target_value == "layer1_0_bn2" and pairing["layer1.0.bn1"].note == "paired name map"
    assert pairing["layer1.1.bn1"].target_value == "layer1_1_bn1" and "by order" in pairing["layer1.1.bn1"].note
    x = random_input(RESNET_INPUT)
    assert np.abs(keras_out(keras_twin, nhwc(x)) - torch_out(torch_resnet, x)).max() > 1e-3  # swapped on purpose


class _DefinedOutOfOrder(torch.nn.Module):
    """bn_b is defined first and called second: named_modules order is not the order forward calls them in."""

    def __init__(self):
        super().__init__()
        self.bn_b = torch.nn.BatchNorm1d(8, eps=1e-3)
        self.fc = torch.nn.Linear(8, 8)
        self.bn_a = torch.nn.BatchNorm1d(8, eps=1e-3)

    def forward(self, x):
        return self.bn_b(self.fc(self.bn_a(x)))


def _out_of_order_twins(names=("bn_a", "bn_b")):
    torch.manual_seed(0)
    model = _DefinedOutOfOrder().eval()
    with torch.no_grad():
        model.bn_a.running_mean.fill_(5.0), model.bn_a.running_var.fill_(4.0)
        model.bn_b.running_mean.fill_(-1.0), model.bn_b.running_var.fill_(0.25), model.bn_b.weight.fill_(3.0)
    inputs = keras.Input((8,))
    x = keras.layers.BatchNormalization(epsilon=1e-3, name=names[0])(inputs)
    x = keras.layers.Dense(8, name="fc")(x)
    twin = keras.Model(inputs, keras.layers.BatchNormalization(epsilon=1e-3, name=names[1])(x))
    twin.get_layer("fc").set_weights([model.fc.weight.detach().numpy().T, model.fc.bias.detach().numpy()])
    return model, twin


def test_layers_named_alike_pair_by_name_when_definition_order_differs_from_call_order():
    """Order paired bn_b with the Keras bn_a (outputs off by 22.9) and reported success."""
    model, twin = _out_of_order_twins()
    report = port_state(model, twin)
    pairing = {r.layer: next(t for t in r.translations if t.setting == "layer") for r in report.layers}
    assert pairing["bn_b"].target_value == "bn_b" and pairing["bn_b"].note == "paired by name"
    x = random_input((4, 8))
    mean, var = model.bn_a.running_mean.numpy(), model.bn_a.running_var.numpy()
    hidden = (x - mean) / np.sqrt(var + 1e-3) @ model.fc.weight.detach().numpy().T + model.fc.bias.detach().numpy()
    b = model.bn_b
    expected = (hidden - b.running_mean.numpy()) / np.sqrt(
        b.running_var.numpy() + 1e-3
    ) * b.weight.detach().numpy() + b.bias.detach().numpy()
    np.testing.assert_allclose(keras_out(twin, x), expected, atol=1e-5)


def test_order_that_contradicts_a_shared_name_is_refused_and_nothing_changes():
    model, twin = _out_of_order_twins(
        names=("bn_a", "other")
    )  # one name shared, one not: order would send bn_b to bn_a
    state, settings = keras_state(twin), keras_settings(twin)
    with pytest.raises(PortMismatchError, match="source layer 'bn_a' would go to target 'other'.*name map"):
        port_state(model, twin)
    assert_keras_unchanged(twin, state, settings)
    port_state(model, twin, {"bn_b": "other"})  # the map settles it
    assert tensors_identical(np.asarray(twin.get_layer("other").moving_mean.numpy()), model.bn_b.running_mean.numpy())


def test_snapshots_put_a_written_layer_back_exactly():
    """What port_state runs when a write fails midway: every target layer restored."""
    from converters.keras_adapter import porting as porting_keras
    from converters.torch_adapter import porting as porting_torch

    module = torch.nn.BatchNorm2d(4, eps=1e-3, momentum=0.2)
    restore = porting_torch.snapshot(module)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with torch.no_grad():
        module.running_var.fill_(7.0)
        module.weight.fill_(2.0)
    module.eps, module.momentum = 1e-5, None
    module.weight.requires_grad_(False)
    markers.remember(module, frozen_identity=("scale",))
    restore()
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert (module.eps, module.momentum, module.weight.requires_grad, markers.recall(module)) == (1e-3, 0.2, True, {})

    layer = keras.layers.BatchNormalization(epsilon=1e-3, momentum=0.9)
    layer.build((None, 4))
    restore = porting_keras.snapshot(layer)
    layer.moving_variance.assign(np.full(4, 7.0, np.float32))
    layer.epsilon, layer.momentum, layer.trainable = 1e-5, 0.5, False
    markers.remember(layer, num_batches_tracked=3)
    restore()
    assert np.all(layer.moving_variance.numpy() == 1.0) and (layer.epsilon, layer.momentum, layer.trainable) == (
        1e-3,
        0.9,
        True,
    )
    assert markers.recall(layer) == {}


# -- other sources: ExportedProgram and ONNX -------------------------------------------------


def test_an_onnx_export_ports_like_its_torch_model(torch_resnet, keras_twin):
    program = torch.onnx.export(
        torch_resnet, (torch.from_numpy(random_input(RESNET_INPUT)),), dynamo=True, optimize=False, verbose=False
    )
    report = port_state(program.model_proto, keras_twin)
    x = random_input(RESNET_INPUT, seed=4)
    np.testing.assert_allclose(keras_out(keras_twin, nhwc(x)), torch_out(torch_resnet, x), atol=ATOL, rtol=0)
    stem = keras_twin.get_layer("stem_1")
    assert stem.epsilon == 1e-3 and stem.momentum == 0.99  # float32 attributes read back as the decimals written
    assert report.layers[0].source_framework == "onnx"


# -- the command line ------------------------------------------------------------------------


def run(*args: str) -> subprocess.CompletedProcess:
    """`normbridge ARGS` in a new process."""
    return subprocess.run(normbridge_command() + list(args), check=False, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_ports_a_pt2_file_into_a_keras_file(torch_resnet, keras_twin, tmp_path):
    source, target, out = tmp_path / "resnet.pt2", tmp_path / "twin.keras", tmp_path / "ported.keras"
    torch.export.save(torch.export.export(torch_resnet, (torch.from_numpy(random_input(RESNET_INPUT)),)), str(source))
    keras_twin.save(target)
    (tmp_path / "map.json").write_text(json.dumps({"layer1.0.bn1": "layer1_0_bn1"}))

    done = run("port", str(source), str(target), "-o", str(out), "--name-map", str(tmp_path / "map.json"), "--json")

    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert len(result["pairs"]) == 10 and result["pairs"][0] == {"source": "stem.1", "target": "stem_1"}
    eps = {t["setting"]: t for t in result["report"]["layers"][0]["translations"]}["eps"]
    assert eps["source_value"] == eps["target_value"] == 0.001
    ported = keras.saving.load_model(out, safe_mode=True, compile=False)
    x = random_input(RESNET_INPUT, seed=6)
    np.testing.assert_allclose(keras_out(ported, nhwc(x)), torch_out(torch_resnet, x), atol=ATOL, rtol=0)

    short = tmp_path / "short.keras"
    keras.Model(keras_twin.input, keras_twin.get_layer("layer2_1_relu1").output).save(short)
    refused = invoke_cli(
        "port", str(source), str(short), "-o", str(tmp_path / "never.keras"), cwd=tmp_path
    )  # in-process: same command
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "layer2.1.bn2" in refused.stderr and "port_mismatch" in refused.stderr
    assert not (tmp_path / "never.keras").exists()
