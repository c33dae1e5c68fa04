"""Keras layers built by normbridge and the input rank: trailing-axes norms take any rank, channel norms the rank given.

Keras's LayerNormalization and RMSNormalization over trailing axes record only the normalised sizes when built,
so one built for rank 3 normalises (N, C) and (N, H, W, C) inputs too; BatchNormalization and GroupNormalization
fix ndim and their reduction axes in build, so they are built for `input_rank=` (or the source's only rank: a
BatchNorm2d's 4) and the report says why; a source that takes several ranks and records none (BatchNorm1d,
GroupNorm) gives a layer built on its first call, and porting such a source into a Keras model reads it at the
target layer's rank. Expected values are the NumPy reference's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

keras = pytest.importorskip("keras")

from converters import from_spec, last_report, reference, to_spec  # noqa: E402
from converters.layout import from_channels_first  # noqa: E402
from converters.models.porting import port_state  # noqa: E402
from schemas import spec_differences  # noqa: E402
from schemas.tensors import tensors_identical  # noqa: E402


def random_state(module: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_floating_point():
                tensor.copy_(torch.rand_like(tensor) + 0.5)
    return module.eval()


@pytest.mark.parametrize(
    "module", [torch.nn.LayerNorm(6, eps=1e-4), torch.nn.RMSNorm(6, eps=1e-4)], ids=["LayerNorm", "RMSNorm"]
)
def test_a_trailing_axes_norm_built_for_one_rank_normalises_inputs_of_every_rank(module):
    spec = to_spec(random_state(module))
    layer = from_spec(spec, "keras")
    [rank_line] = [t for t in last_report().layers[0].translations if t.setting == "input_rank"]
    assert "fixes no input rank" in rank_line.note
    for shape in [(4, 6), (4, 3, 6), (2, 3, 5, 6)]:
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        out = np.asarray(layer(x, training=False))
        np.testing.assert_allclose(
            out, reference.forward(spec, x.astype(np.float64), training=False), rtol=1e-4, atol=1e-5
        )


def test_a_batchnorm_is_built_for_the_rank_asked_and_the_report_says_why_the_rank_is_fixed():
    spec = to_spec(random_state(torch.nn.BatchNorm1d(6)))
    layer = from_spec(spec, "keras", input_rank=2)
    [rank_line] = [t for t in last_report().layers[0].translations if t.setting == "input_rank"]
    assert rank_line.target_value == 2 and "InputSpec fixes ndim" in rank_line.note
    x = np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32)
    want = reference.forward(spec, x.astype(np.float64), training=False)
    np.testing.assert_allclose(
        np.asarray(layer(from_channels_first(x, "channels_last"), training=False)), want, rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize(
    "module", [torch.nn.BatchNorm1d(6, eps=1e-4), torch.nn.GroupNorm(3, 6, eps=1e-4)], ids=["BatchNorm1d", "GroupNorm"]
)
def test_a_source_of_several_ranks_gives_a_layer_built_on_its_first_call(module):
    spec = to_spec(random_state(module))
    for shape in [(5, 6), (5, 4, 6)]:
        layer = from_spec(spec, "keras")
        [rank_line] = [t for t in last_report().layers[0].translations if t.setting == "input_rank"]
        assert not layer.built and "first input" in rank_line.note and "InputSpec fixes ndim" in rank_line.note
        read = to_spec(layer)  # read without building it: Keras's layout and running-variance estimator, no rank yet
        assert (
            spec_differences(spec, read, ignore=("source", "layout", "variance_estimator")) == []
            and read.input_rank is None
        )
        assert not layer.built
        x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
        want = reference.forward(spec, np.moveaxis(x, -1, 1).astype(np.float64), training=False)
        np.testing.assert_allclose(np.moveaxis(np.asarray(layer(x, training=False)), -1, 1), want, rtol=1e-4, atol=1e-5)
        assert layer.built and to_spec(layer).input_rank == len(shape)
        assert np.array_equal(layer.gamma.numpy(), spec.tensors["scale"]) and np.array_equal(
            layer.beta.numpy(), spec.tensors["bias"]
        )
        assert layer.get_config()["gamma_initializer"]["class_name"] == "Ones"  # a stock layer's config, no state in it


def test_a_batchnorm2d_has_one_rank_and_is_built_for_it():
    spec = to_spec(random_state(torch.nn.BatchNorm2d(6)))
    layer = from_spec(spec, "keras")
    assert layer.built and to_spec(layer).input_rank == 4


def test_a_batchnorm1d_and_a_groupnorm_on_flat_features_port_bit_exactly():
    """Neither records an input rank (BatchNorm1d takes (N, C) and (N, C, L)); the converted layer is built on first
    call, so porting must read its state at the target layer's own rank, not find no variables and write identities."""
    torch.manual_seed(3)
    source = torch.nn.Sequential(
        torch.nn.Linear(5, 6), torch.nn.BatchNorm1d(6, eps=1e-3), torch.nn.GroupNorm(3, 6, eps=1e-4)
    ).eval()
    with torch.no_grad():
        for norm in (source[1], source[2]):
            norm.weight.copy_(torch.rand(6) + 0.5)
            norm.bias.copy_(torch.randn(6))
        source[1].running_mean.copy_(torch.randn(6))
        source[1].running_var.copy_(torch.rand(6) + 0.5)
    twin = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(6, name="dense"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.GroupNormalization(groups=3, name="gn"),
        ]
    )
    twin.get_layer("dense").set_weights([source[0].weight.detach().numpy().T, source[0].bias.detach().numpy()])
    port_state(source, twin)
    bn, gn = twin.get_layer("bn"), twin.get_layer("gn")
    for variable, tensor in (
        (bn.gamma, source[1].weight),
        (bn.beta, source[1].bias),
        (bn.moving_mean, source[1].running_mean),
        (bn.moving_variance, source[1].running_var),
        (gn.gamma, source[2].weight),
        (gn.beta, source[2].bias),
    ):
        assert tensors_identical(np.asarray(variable.numpy()), tensor.detach().numpy()), variable.path
    x = np.random.default_rng(4).standard_normal((7, 5)).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(twin(x, training=False)), source(torch.from_numpy(x)).detach().numpy(), atol=1e-4, rtol=0
    )
