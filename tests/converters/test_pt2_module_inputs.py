"""A hand-written norm in a `.pt2` whose input its parent made with a view or a cast,
and whose input cast the parent reuses.

The module's nodes (grouped by `nn_module_stack`) start at a value the parent computed. Qwen3's
`q_norm(q_proj(x).view(B, L, H, D))` and Cohere's qk norm hand the norm a parent's view; Mamba's block hands its
MambaRMSNorm `h.to(weight.dtype)` and, with `residual_in_fp32`, its `residual.to(float32)` is the norm's own no-op
`h.to(float32)` (torch.export's alias). Both were refused ("the squares under its square root are not of the input ...",
"it takes 1 tensor inputs and gives 2 outputs") because the walk back through views and casts went past the module's
input. A module that computes no normalization is still refused.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from converters.models.inspection import inspect_model
from converters.torch_adapter.recognition.exported_computed import program_modules

from tests import real_norms as R


class LlamaStyleRMSNorm(nn.Module):
    """transformers' LlamaRMSNorm / Qwen3RMSNorm forward."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.ones(dim)), eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class HeadNorm(nn.Module):
    """Qwen3's attention, reduced: a projection viewed as (B, L, H, D) in the parent, normalised over D."""

    def __init__(self, norm: nn.Module, heads: int = 4, head_dim: int = 16):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.proj = nn.Linear(64, heads * head_dim)
        self.norm = norm

    def forward(self, x):
        b, length, _ = x.shape
        return self.norm(self.proj(x).view(b, length, self.heads, self.head_dim))


class MambaBlock(nn.Module):
    """transformers' MambaBlock with residual_in_fp32, its mixer a Linear."""

    def __init__(self, norm: nn.Module, dim: int = 16):
        super().__init__()
        self.norm, self.mixer = norm, nn.Linear(dim, dim)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.norm(hidden_states.to(dtype=self.norm.weight.dtype))
        residual = residual.to(torch.float32)
        return residual + self.mixer(hidden_states)


class Mamba(nn.Module):
    def __init__(self, norm: nn.Module, dim: int = 16):
        super().__init__()
        self.embed, self.block = nn.Linear(8, dim), MambaBlock(norm, dim)

    def forward(self, x):
        return self.block(self.embed(x))


def _export(model: nn.Module, x: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(R.randomise(model).eval(), (x,))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).numpy()


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _unrecognised(program) -> list[str]:
    return [h.message for _, h in inspect_model(program).all_hazards() if h.code == "unrecognised_normalization"]


@pytest.mark.parametrize(
    "build",
    [lambda: LlamaStyleRMSNorm(16, eps=3e-6), lambda: R.RmsNorm(16, eps=3e-6)],
    ids=["written_out", "F.rms_norm"],
)
def test_a_norm_of_its_parents_view_is_read_and_proved(build):
    model = HeadNorm(build())
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(3))
    program = _export(model, x)

    [found] = program_modules(program)
    assert (found.path, found.reason) == ("norm", None)
    spec = found.spec
    assert (spec.kind, tuple(spec.normalized_shape), spec.eps) == ("rms", (16,), pytest.approx(3e-6, rel=1e-12))
    np.testing.assert_array_equal(np.asarray(spec.tensors["scale"]), _np(model.norm.weight))
    assert [(layer.path, layer.kind) for layer in inspect_model(program).layers] == [("norm", "rms")]
    assert _unrecognised(program) == []

    with torch.no_grad():
        y = program.module()(x)
        viewed = _np(model.proj(x)).reshape(2, 5, 4, 16)
    np.testing.assert_allclose(_np(y), _rms(viewed, _np(model.norm.weight), 3e-6), rtol=2e-5, atol=2e-5)


def test_a_non_normalization_of_its_parents_view_is_still_refused():
    program = _export(HeadNorm(R.EpsOutsideNorm(16)), torch.randn(2, 5, 64))
    assert program_modules(program)[0].spec is None
    [message] = _unrecognised(program)
    assert message.startswith("'norm' (EpsOutsideNorm)")


def test_mambas_norm_whose_input_cast_the_block_reuses_for_its_residual_is_read_and_proved():
    model = Mamba(LlamaStyleRMSNorm(16, eps=1e-5))
    x = torch.randn(2, 7, 8, generator=torch.Generator().manual_seed(4))
    program = _export(model, x)
    norm_casts = [
        n
        for n in program.graph.nodes
        if n.target == torch.ops.aten.to.dtype
        and any(path == "block.norm" for path, _ in (n.meta.get("nn_module_stack") or {}).values())
    ]
    assert any(
        user not in norm_casts and "block.norm" not in str(user.meta.get("nn_module_stack"))
        for cast in norm_casts
        for user in cast.users
    ), "the pattern: the norm's own cast is used by the block"

    [found] = program_modules(program)
    assert (found.path, found.reason) == ("block.norm", None)
    spec = found.spec
    assert (spec.kind, tuple(spec.normalized_shape), spec.eps) == ("rms", (16,), pytest.approx(1e-5, rel=1e-12))
    np.testing.assert_array_equal(np.asarray(spec.tensors["scale"]), _np(model.block.norm.weight))
    assert _unrecognised(program) == []

    with torch.no_grad():
        y = program.module()(x)
        h = _np(model.embed(x))
    normed = _rms(h, _np(model.block.norm.weight), 1e-5)
    want = h + normed @ _np(model.block.mixer.weight).T + _np(model.block.mixer.bias)
    np.testing.assert_allclose(_np(y), want, rtol=2e-5, atol=2e-5)


class TwoOutputNorm(LlamaStyleRMSNorm):
    """An RMSNorm that also hands its parent its mean square: a second output, not a normalization's."""

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon)), variance


class TwoOutputBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.norm = nn.Linear(8, 16), TwoOutputNorm(16, eps=1e-5)

    def forward(self, x):
        y, variance = self.norm(self.embed(x).to(torch.float32))
        return y + variance


@pytest.mark.parametrize(
    "build, reason",
    [
        (lambda: Mamba(R.EpsOutsideNorm(16)), "it has no rsqrt or division by a sqrt"),
        (TwoOutputBlock, "it takes 1 tensor inputs and gives 2 outputs"),
    ],
    ids=["eps_outside", "second_output"],
)
def test_a_module_in_the_same_place_that_computes_no_normalization_is_still_refused(build, reason):
    program = _export(build(), torch.randn(2, 7, 8))
    [found] = program_modules(program)
    assert found.spec is None and found.reason.startswith(reason), found.reason
    assert len(_unrecognised(program)) == 1
