"""Issue 34, items 12 and 13: models called by keyword, and the module of an ExportedProgram,
under the serving collector.

transformers models are called `model(pixel_values=x)`: their inputs are kept for the traffic sample under their names,
as positional ones are, in the forward's order, and options (flags, None) are not inputs. What cannot be kept (a
program input holding several tensors) is refused when the monitor starts, not counted as an error on every request.
`ep.module()`, how most people run an ExportedProgram, holds batch-norm calls rather than BatchNorm modules: its graph
is tapped in place (the caller keeps calling it) and its windows are NumPy over the inputs each layer received, read by
hooks of this test on the nn.Module the program was exported from.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import converters
from converters.models.loading import load_model
from schemas import InputFileError, UnsupportedObjectError
from schemas.monitoring import DriftWindow
from tests.real_norms import detr, randomise

warnings.filterwarnings("ignore", message=".*LeafSpec.*")

BATCH = torch.export.Dim("batch", min=1, max=1024)


@pytest.fixture(autouse=True)
def _one_thread():
    """These tensors are tiny: on a shared CPU one intra-op thread runs them several times faster than two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    return randomise(
        ResNetModel(
            ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
        ),
        seed=1,
    )


def _regnet() -> nn.Module:
    from transformers import RegNetConfig, RegNetModel

    torch.manual_seed(0)
    config = RegNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=4, layer_type="y"
    )
    return randomise(RegNetModel(config), seed=2)


def _requests(n: int, seed: int, shape=(2, 3, 32, 32)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * 1.5 + 0.5).astype(np.float32) for _ in range(n)]


def _bn_inputs(model: nn.Module, requests: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Each BatchNorm2d's input over `requests`, read by hooks of this test on the nn.Module."""
    seen: dict[str, list] = {name: [] for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}

    def reads(name):
        def hook(_module, args):
            seen[name].append(args[0].detach().double().numpy())

        return hook

    handles = [model.get_submodule(name).register_forward_pre_hook(reads(name)) for name in seen]
    with torch.no_grad():
        for x in requests:
            model(torch.from_numpy(x))
    for handle in handles:
        handle.remove()
    return {name: np.concatenate(v) for name, v in seen.items()}


# -- item 12: keyword inputs ---------------------------------------------------------------------------------------


def test_a_transformers_resnet_called_by_keyword_keeps_its_inputs_under_their_name_for_recalibrate(tmp_path):
    """It failed every request ("no common batch axis (shapes [])") and save_sample said to serve more requests."""
    model = _resnet()
    requests = _requests(5, seed=1)
    watch = converters.monitor(model, sample_rate=1.0, window_requests=1000, keep_sample=6)
    with torch.no_grad():
        for i, x in enumerate(requests):  # by keyword, and by position: one input either way
            model(pixel_values=torch.from_numpy(x)) if i % 2 == 0 else model(
                torch.from_numpy(x), output_hidden_states=False
            )
    stats = watch.stats()
    rows = watch.save_sample(tmp_path / "traffic.npz")
    watch.close()
    assert (stats.requests, stats.sampled, stats.errors, stats.last_error) == (5, 5, 0, None)
    assert rows == stats.kept_rows == 6
    with np.load(tmp_path / "traffic.npz") as saved:
        assert saved.files == ["pixel_values"]
        np.testing.assert_array_equal(saved["pixel_values"], np.concatenate(requests)[-6:])
    # the sample is what `recalibrate` reads for the model's program, matched to its input by name
    program = torch.export.export(
        model, (), {"pixel_values": torch.from_numpy(requests[0])}, dynamic_shapes={"pixel_values": {0: BATCH}}
    )
    _, report = converters.recalibrate(program, str(tmp_path / "traffic.npz"), batch_size=3)
    assert (report.samples, report.batches) == (6, 2)


def test_a_program_served_by_keyword_keeps_its_inputs_and_answers_as_its_module_does(tmp_path):
    model = _resnet()
    requests = _requests(3, seed=2)
    program = torch.export.export(
        model, (), {"pixel_values": torch.from_numpy(requests[0])}, dynamic_shapes={"pixel_values": {0: BATCH}}
    )
    watch = converters.monitor(program, sample_rate=1.0, window_requests=3, keep_sample=4)
    with torch.no_grad():
        served = [watch.served(pixel_values=torch.from_numpy(x)).last_hidden_state for x in requests]
        expected = [program.module()(pixel_values=torch.from_numpy(x)).last_hidden_state for x in requests]
    stats = watch.stats()
    watch.save_sample(tmp_path / "traffic.npz")
    watch.close()
    assert stats.errors == 0 and stats.windows_closed == 1
    for a, b in zip(served, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with np.load(tmp_path / "traffic.npz") as saved:
        assert saved.files == ["pixel_values"]
        np.testing.assert_array_equal(saved["pixel_values"], np.concatenate(requests)[-4:])


def test_keyword_inputs_are_kept_in_the_forwards_order_and_options_are_not_inputs(tmp_path):
    """Another member of the family: transformers DETR, called with two tensors by keyword in another order than its
    forward's and with an option; its frozen BatchNorms keep eps in their forward, not in an attribute."""
    model = randomise(detr(), seed=3)
    rng = np.random.default_rng(4)
    images = [rng.standard_normal((2, 3, 32, 32)).astype(np.float32) for _ in range(3)]
    masks = [rng.integers(0, 2, (2, 32, 32)).astype(np.int64) for _ in range(3)]
    watch = converters.monitor(model, sample_rate=1.0, window_requests=1000, keep_sample=4)
    assert len(watch.layers) == 6
    with torch.no_grad():
        for x, mask in zip(images, masks):
            model(pixel_mask=torch.from_numpy(mask), pixel_values=torch.from_numpy(x), output_attentions=False)
    assert watch.save_sample(tmp_path / "traffic.npz") == 4
    with np.load(tmp_path / "traffic.npz") as saved:
        assert saved.files == ["pixel_values", "pixel_mask"]
        np.testing.assert_array_equal(saved["pixel_values"], np.concatenate(images)[-4:])
        np.testing.assert_array_equal(saved["pixel_mask"], np.concatenate(masks)[-4:])
    with torch.no_grad():  # a request without the mask passes other inputs: saving says so, naming both
        model(pixel_values=torch.from_numpy(images[0]))
    with pytest.raises(InputFileError, match=r"different inputs \(\(pixel_values\); \(pixel_values, pixel_mask\)\)"):
        watch.save_sample(tmp_path / "mixed.npz")
    stats = watch.stats()
    watch.close()
    assert stats.errors == 0


def test_a_program_input_holding_several_tensors_is_refused_when_the_monitor_starts():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(3)

        def forward(self, batch):
            return self.bn(batch["image"]) * batch["scale"]

    x = {"image": torch.randn(2, 3, 4, 4), "scale": torch.randn(2, 3, 4, 4)}
    program = torch.export.export(Pair().eval(), (x,))
    module = program.module()
    hooks = dict(module._forward_pre_hooks)  # torch's own (input constraints)
    for served in (program, module):
        with pytest.raises(
            UnsupportedObjectError,
            match=r"keep_sample=4\): input 'batch' .* holds several tensors .*batch_image, batch_scale",
        ):
            converters.monitor(served, keep_sample=4)
    assert (
        "tap(" not in module.code and dict(module._forward_pre_hooks) == hooks
    )  # the refused monitor left nothing behind
    watch = converters.monitor(module, sample_rate=1.0, window_requests=1)  # without a sample it is monitored
    with torch.no_grad():
        module(x)
    assert watch.stats().errors == 0 and len(watch.closed_windows) == 1
    watch.close()


# -- item 13: ep.module() ----------------------------------------------------------------------------------------------


def test_the_module_of_a_transformers_resnet_program_is_tapped_in_place_and_its_windows_are_numpy_over_its_inputs(
    tmp_path,
):
    """`torch.export.load("m.pt2").module()` was refused ("no BatchNorm with running statistics ... nothing to
    monitor")."""
    model = _resnet()
    requests = _requests(4, seed=5)
    torch.export.save(
        torch.export.export(model, (torch.from_numpy(requests[0]),), dynamic_shapes=({0: BATCH},)), tmp_path / "m.pt2"
    )
    program = torch.export.load(tmp_path / "m.pt2")
    m = program.module()
    hooks = (dict(m._forward_pre_hooks), dict(m._forward_hooks))  # torch's own (input constraints)
    with torch.no_grad():
        expected = [m(torch.from_numpy(x)).last_hidden_state for x in requests]
    watch = converters.monitor(m, sample_rate=1.0, window_requests=len(requests))
    assert watch.served is m
    with torch.no_grad():
        served = [m(torch.from_numpy(x)).last_hidden_state for x in requests]  # the caller keeps calling its own module
    stats = watch.stats()
    watch.close()
    assert (stats.requests, stats.errors, stats.windows_closed) == (4, 0, 1)
    for a, b in zip(served, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with_program = converters.monitor(program)
    with_program.close()
    assert watch.layers == with_program.layers and watch.statistics_digest == with_program.statistics_digest
    inputs = _bn_inputs(model, requests)
    window = DriftWindow.model_validate(watch.closed_windows[0])
    assert sorted(layer.name for layer in window.layers) == sorted(inputs)
    for layer in window.layers:
        x = inputs[layer.name]
        assert layer.count == x.shape[0] * x.shape[2] * x.shape[3]
        np.testing.assert_allclose(layer.mean, x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layer.var, x.var(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    # closing took the taps out of the caller's graph and the hooks off it; the module answers as before
    assert "tap(" not in m.code and (dict(m._forward_pre_hooks), dict(m._forward_hooks)) == hooks
    with torch.no_grad():
        torch.testing.assert_close(m(torch.from_numpy(requests[0])).last_hidden_state, expected[0], rtol=0, atol=0)


def test_the_module_of_a_regnet_program_read_by_normbridge_is_monitored_and_keeps_keyword_inputs(tmp_path):
    """Another member of the family: a transformers RegNet (squeeze-excitation between BatchNorms), its .pt2 read by
    normbridge's own safe reader, its module called by keyword with a traffic sample kept."""
    model = _regnet()
    requests = _requests(3, seed=6)
    exported = torch.export.export(
        model, (), {"pixel_values": torch.from_numpy(requests[0])}, dynamic_shapes={"pixel_values": {0: BATCH}}
    )
    torch.export.save(exported, tmp_path / "r.pt2")
    m = load_model(tmp_path / "r.pt2").module()
    watch = converters.monitor(m, sample_rate=1.0, window_requests=len(requests), keep_sample=4)
    with torch.no_grad():
        for x in requests:
            m(pixel_values=torch.from_numpy(x))
    stats = watch.stats()
    watch.save_sample(tmp_path / "traffic.npz")
    watch.close()
    assert stats.errors == 0 and len(watch.layers) == 9
    inputs = _bn_inputs(model, requests)
    for layer in DriftWindow.model_validate(watch.closed_windows[0]).layers:
        np.testing.assert_allclose(layer.mean, inputs[layer.name].mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layer.var, inputs[layer.name].var(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    with np.load(tmp_path / "traffic.npz") as saved:
        assert saved.files == ["pixel_values"]
        np.testing.assert_array_equal(saved["pixel_values"], np.concatenate(requests)[-4:])
