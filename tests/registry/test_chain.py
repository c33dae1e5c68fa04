"""A hand-built layer keeps its non-default eps and momentum through torch -> onnx -> keras -> torch."""

from __future__ import annotations

import onnx
import pytest
import torch

import converters


def trained(module: torch.nn.Module, shape: tuple[int, ...]) -> torch.nn.Module:
    torch.manual_seed(3)
    module.train()
    for _ in range(4):
        module(torch.randn(*shape) * 2 + 0.5)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return module.eval()


CHAIN_MODULES = [
    pytest.param(lambda: trained(torch.nn.BatchNorm2d(8, eps=1e-3, momentum=0.01), (6, 8, 5, 5)), id="batchnorm2d"),
    pytest.param(lambda: trained(torch.nn.LayerNorm([4, 6], eps=2e-5), (3, 2, 4, 6)), id="layernorm"),
    pytest.param(lambda: trained(torch.nn.RMSNorm(6), (3, 6)), id="rmsnorm-eps-none"),
    pytest.param(lambda: trained(torch.nn.GroupNorm(2, 6, eps=1e-4), (3, 6, 4, 4)), id="groupnorm"),
    pytest.param(lambda: trained(torch.nn.InstanceNorm2d(3, eps=1e-3, affine=True), (3, 3, 4, 4)), id="instancenorm"),
]


@pytest.mark.parametrize("build", CHAIN_MODULES)
def test_torch_onnx_keras_torch_keeps_everything(build):
    original = build()
    onnx_model = converters.convert(original, "onnx")
    keras_layer = converters.convert(onnx_model, "keras")
    back = converters.convert(keras_layer, "torch")
    assert type(back) is type(original)
    assert back.eps == original.eps  # exactly, e.g. 1e-3 and not 0.0010000000474974513
    if getattr(original, "track_running_stats", False):
        assert back.momentum == original.momentum  # exactly 0.01, not 0.010000000000000009
    for name, tensor in original.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_without_onnx_metadata_eps_and_momentum_still_come_back_exactly():
    original = trained(torch.nn.BatchNorm2d(4, eps=1e-3, momentum=0.01), (6, 4, 3, 3))
    model = converters.convert(original, "onnx")
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    del stripped.metadata_props[:]
    spec = converters.to_spec(stripped)
    assert spec.eps == 1e-3 and spec.momentum_as("batch_weight") == 0.01
    back = converters.from_spec(spec, "torch")
    assert back.eps == 1e-3 and back.momentum == 0.01
    assert torch.equal(back.running_var, original.running_var)
