"""Keras layers built by normbridge and the input rank: trailing-axes norms take any rank, channel norms the rank given.

Keras's LayerNormalization and RMSNormalization over trailing axes record only the normalised sizes when built,
so one built for rank 3 normalises (N, C) and (N, H, W, C) inputs too; BatchNormalization and GroupNormalization
fix ndim and their reduction axes in build, so they are built for `input_rank=` (or the source's only rank: a
BatchNorm2d's 4) and the report says why; a source that takes several ranks and records none (BatchNorm1d,
GroupNorm) gives a layer built on its first call. Expected values are the NumPy reference's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from converters import from_spec, last_report, reference, to_spec
from converters.layout import from_channels_first
from schemas import spec_differences


def random_state(module: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_floating_point():
                tensor.copy_(torch.rand_like(tensor) + 0.5)
    return module.eval()


@pytest.mark.parametrize("module", [torch.nn.LayerNorm(6, eps=1e-4), torch.nn.RMSNorm(6, eps=1e-4)], ids=["LayerNorm", "RMSNorm"])
def test_a_trailing_axes_norm_built_for_one_rank_normalises_inputs_of_every_rank(module):
    spec = to_spec(random_state(module))
    layer = from_spec(spec, "keras")
    [rank_line] = [t for t in last_report().layers[0].translations if t.setting == "input_rank"]
    assert "fixes no input rank" in rank_line.note
    for shape in [(4, 6), (4, 3, 6), (2, 3, 5, 6)]:
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        out = np.asarray(layer(x, training=False))
        np.testing.assert_allclose(out, reference.forward(spec, x.astype(np.float64), training=False), rtol=1e-4, atol=1e-5)


def test_a_batchnorm_is_built_for_the_rank_asked_and_the_report_says_why_the_rank_is_fixed():
    spec = to_spec(random_state(torch.nn.BatchNorm1d(6)))
    layer = from_spec(spec, "keras", input_rank=2)
    [rank_line] = [t for t in last_report().layers[0].translations if t.setting == "input_rank"]
    assert rank_line.target_value == 2 and "InputSpec fixes ndim" in rank_line.note
    x = np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32)
    want = reference.forward(spec, x.astype(np.float64), training=False)
    np.testing.assert_allclose(np.asarray(layer(from_channels_first(x, "channels_last"), training=False)), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("module", [torch.nn.BatchNorm1d(6, eps=1e-4), torch.nn.GroupNorm(3, 6, eps=1e-4)], ids=["BatchNorm1d", "GroupNorm"])
def test_a_source_of_several_ranks_gives_a_layer_built_on_its_first_call(module):
    spec = to_spec(random_state(module))
    for shape in [(5, 6), (5, 4, 6)]:
        layer = from_spec(spec, "keras")
        [rank_line] = [t for t in last_report().layers[0].translations if t.setting == "input_rank"]
        assert not layer.built and "first input" in rank_line.note and "InputSpec fixes ndim" in rank_line.note
        read = to_spec(layer)  # read without building it: Keras's layout and running-variance estimator, no rank yet
        assert spec_differences(spec, read, ignore=("source", "layout", "variance_estimator")) == [] and read.input_rank is None
        assert not layer.built
        x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
        want = reference.forward(spec, np.moveaxis(x, -1, 1).astype(np.float64), training=False)
        np.testing.assert_allclose(np.moveaxis(np.asarray(layer(x, training=False)), -1, 1), want, rtol=1e-4, atol=1e-5)
        assert layer.built and to_spec(layer).input_rank == len(shape)
        assert np.array_equal(layer.gamma.numpy(), spec.tensors["scale"]) and np.array_equal(layer.beta.numpy(), spec.tensors["bias"])
        assert layer.get_config()["gamma_initializer"]["class_name"] == "Ones"  # a stock layer's config, no state in it


def test_a_batchnorm2d_has_one_rank_and_is_built_for_it():
    spec = to_spec(random_state(torch.nn.BatchNorm2d(6)))
    layer = from_spec(spec, "keras")
    assert layer.built and to_spec(layer).input_rank == 4
