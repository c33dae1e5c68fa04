"""Issue 34, items 1-4: families whose normalizations were misread, missed or refused whole, each on a transformers
model from a small config (random init, randomized norm states) and on another member of its family.

1. A normalization of a parameter (BiT's weight standardization, timm's ScaledStdConv2d, one written out, weight_norm
   and spectral_norm) is no activation normalization: not listed, no hazard, `register` passes.
2. An inline standardization (PatchTST's and PatchTSMixer's std scalers, one in a model's own forward) is named as an
   unrecognised normalization, never silently missed.
3. A channels-first LayerNorm subclass applied through permutes or transposes (SqueezeBERT's, a twin) is read, rebuilt
   and proved on the rank it is applied at, and `register` passes.
4. A library's own operator in a `.pt2` (DeepSeek-V3's and Mixtral's `transformers::grouped_mm_fallback`) leaves every
   normalization outside it read and checked; the call is unrecognised (--allow-unrecognised registers it); running
   the program raises naming the operator; a normalization that calls such an operator is unrecognised.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from converters.models.inspection import inspect_path
from converters.torch_adapter.pt2.archive import load_exported_program
from converters.torch_adapter.recognition.computed import recognition
from converters.torch_adapter.restoring import restore_class
from schemas.errors import UnrecognisedNormalizationError
from tests import real_norms as R
from tests.cli_run import invoke_cli

transformers = pytest.importorskip("transformers")


def saved(model: nn.Module, example: tuple, path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.save(torch.export.export(model, example), str(path))
    return path


def store(tmp_path: Path) -> list[str]:
    return ["--db", f"sqlite:///{tmp_path / 'r.db'}", "--blobs", str(tmp_path / "blobs")]


def unrecognised(inspection) -> dict[str, str]:
    return {h.layer: h.message for h in inspection.hazards if h.code == "unrecognised_normalization"}


def codes(inspection) -> set[str]:
    return {h.code for h in inspection.hazards} | {h.code for layer in inspection.layers for h in layer.hazards}


# -- 1. normalizations of a parameter ------------------------------------------------------------------------------


def bit() -> nn.Module:
    config = transformers.BitConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_groups=4, layer_type="preactivation"
    )
    return R.randomise(transformers.BitModel(config))


class ScaledStdConv2d(nn.Conv2d):
    """timm's ScaledStdConv2d (from its formula): F.batch_norm on its own kernel, with a learned gain as the weight."""

    def __init__(self, cin: int, cout: int):
        super().__init__(cin, cout, 3, padding=1)
        self.gain = nn.Parameter(torch.ones(cout, 1, 1, 1))
        self.scale = (cin * 9) ** -0.5

    def forward(self, x):
        weight = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1),
            None,
            None,
            weight=(self.gain * self.scale).view(-1),
            training=True,
            momentum=0.0,
            eps=1e-6,
        )
        weight = weight.reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding)


class WrittenOutStdConv2d(nn.Conv2d):
    """Weight standardization written out: (w - mean w) / sqrt(var w + eps) over each output channel's kernel."""

    def forward(self, x):
        w = self.weight
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        var = ((w - mean) ** 2).mean(dim=(1, 2, 3), keepdim=True)
        return F.conv2d(x, (w - mean) / torch.sqrt(var + 1e-5), self.bias, padding=1)


class StandardizedWeights(nn.Module):
    """The family's other members in one model, with one GroupNorm (the only activation normalization)."""

    def __init__(self):
        super().__init__()
        self.scaled = ScaledStdConv2d(3, 8)
        self.written = WrittenOutStdConv2d(8, 8, 3)
        self.weight_normed = nn.utils.parametrizations.weight_norm(nn.Conv2d(8, 8, 3, padding=1))
        self.spectral = nn.utils.parametrizations.spectral_norm(nn.Conv2d(8, 8, 3, padding=1))
        self.norm = nn.GroupNorm(2, 8)

    def forward(self, x):
        return self.norm(self.spectral(self.weight_normed(self.written(self.scaled(x)))))


@pytest.mark.parametrize(
    "build,example,expected",
    [
        (bit, (torch.randn(2, 3, 32, 32),), 7),
        (lambda: R.randomise(StandardizedWeights()), (torch.randn(2, 3, 16, 16),), 1),
    ],
    ids=["BiT", "ScaledStdConv-written-weight_norm-spectral_norm"],
)
def test_a_normalization_of_a_parameter_is_not_listed_and_the_model_registers(build, example, expected, tmp_path):
    model = build()
    saved(model, example, tmp_path / "m.pt2")
    inspection = inspect_path(tmp_path / "m.pt2")
    assert len(inspection.layers) == expected and all(layer.kind == "group" for layer in inspection.layers)
    assert not {"batch_stats_at_eval", "unrecognised_normalization"} & codes(inspection)
    done = invoke_cli("register", "m", "m.pt2", *store(tmp_path), cwd=tmp_path, columns=200)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{expected}/{expected} normalization layers passed" in done.stdout


# -- 2. an inline standardization ---------------------------------------------------------------------------------


class InlineStandardization(nn.Module):
    """A model standardizing its input over time in its own forward (RevIN without affine), then a Linear."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        x = (x - x.mean(1, keepdim=True)) / torch.sqrt(x.var(1, keepdim=True, unbiased=False) + 1e-5)
        return self.proj(x)


def patchtst() -> nn.Module:
    config = transformers.PatchTSTConfig(
        num_input_channels=3,
        context_length=32,
        patch_length=8,
        patch_stride=8,
        d_model=16,
        num_attention_heads=2,
        num_hidden_layers=1,
        ffn_dim=32,
    )
    return R.randomise(transformers.PatchTSTModel(config))


def patchtsmixer() -> nn.Module:
    config = transformers.PatchTSMixerConfig(
        context_length=32, patch_length=8, patch_stride=8, num_input_channels=3, d_model=16, num_layers=1, scaling="std"
    )
    return R.randomise(transformers.PatchTSMixerModel(config))


@pytest.mark.parametrize(
    "build,example,path,found",
    [
        (patchtst, (torch.randn(2, 32, 3),), "scaler.scaler", 2),
        (patchtsmixer, (torch.randn(2, 32, 3),), "scaler", 2),
        (InlineStandardization, (torch.randn(2, 16, 8),), "InlineStandardization", 0),
    ],
    ids=["PatchTST", "PatchTSMixer", "in-the-model's-forward"],
)
def test_an_inline_standardization_is_named_as_unrecognised_never_missed(build, example, path, found, tmp_path):
    saved(build().eval(), example, tmp_path / "m.pt2")
    inspection = inspect_path(tmp_path / "m.pt2")
    assert len(inspection.layers) == found
    messages = unrecognised(inspection)
    assert list(messages) == [path]
    assert "square root of a statistic of its input plus 1e-05" in messages[path]
    from registry.service import Registry

    registry = Registry(db=f"sqlite:///{tmp_path / 'r.db'}", blobs=str(tmp_path / "blobs"), user="tester")
    with pytest.raises(UnrecognisedNormalizationError) as info:
        registry.register("m", tmp_path / "m.pt2")
    assert info.value.layer == path and "--allow-unrecognised" in str(info.value)


# -- 3. a channels-first LayerNorm subclass ------------------------------------------------------------------------


class TransposedLayerNorm(nn.LayerNorm):
    """A twin of SqueezeBERT's: a LayerNorm subclass taking (N, C, W), through transposes instead of a permute."""

    def forward(self, x):
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


def squeezebert() -> nn.Module:
    config = transformers.SqueezeBertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        embedding_size=16,
        q_groups=2,
        k_groups=2,
        v_groups=2,
        post_attention_groups=2,
        intermediate_groups=2,
        output_groups=2,
    )
    return R.randomise(transformers.SqueezeBertModel(config))


class Conv1dBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv1d(8, 8, 3, padding=1), TransposedLayerNorm(8, eps=1e-6)

    def forward(self, x):
        return self.norm(self.conv(x))


@pytest.mark.parametrize(
    "norm",
    [
        lambda: transformers.models.squeezebert.modeling_squeezebert.SqueezeBertLayerNorm(16, eps=1e-12),
        lambda: TransposedLayerNorm(8, eps=1e-6),
    ],
    ids=["SqueezeBertLayerNorm", "transposed-twin"],
)
def test_a_channels_first_layernorm_subclass_is_read_and_rebuilt_at_the_rank_it_takes(norm):
    module = R.randomise(norm())
    found = recognition(module)
    assert found.spec is not None, found.reason
    assert (found.spec.kind, found.spec.layout, found.spec.input_rank) == ("layer", "channels_first", 3)
    rebuilt, how = restore_class(found.spec)
    assert type(rebuilt) is type(module), how
    x = torch.randn(4, module.weight.shape[0], 5)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), module(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "build,example,expected,channels_first",
    [
        (squeezebert, (torch.randint(0, 64, (2, 8)),), 3, 2),
        (lambda: R.randomise(Conv1dBlock()), (torch.randn(2, 8, 5),), 1, 1),
    ],
    ids=["SqueezeBERT", "transposed-twin"],
)
def test_a_model_with_a_channels_first_layernorm_subclass_registers(build, example, expected, channels_first, tmp_path):
    saved(build(), example, tmp_path / "m.pt2")
    inspection = inspect_path(tmp_path / "m.pt2")
    assert sum(layer.spec.get("layout") == "channels_first" for layer in inspection.layers) == channels_first
    assert not {"computes_more", "unrecognised_normalization"} & codes(inspection)
    done = invoke_cli("register", "m", "m.pt2", *store(tmp_path), cwd=tmp_path, columns=200)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{expected}/{expected} normalization layers passed" in done.stdout


# -- 4. a library's own operator ------------------------------------------------------------------------------------


def deepseek() -> nn.Module:
    config = transformers.DeepseekV3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        max_position_embeddings=64,
        use_cache=False,
    )
    return R.randomise(transformers.DeepseekV3Model(config))


def mixtral() -> nn.Module:
    config = transformers.MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        use_cache=False,
    )
    return R.randomise(transformers.MixtralModel(config))


@pytest.mark.parametrize(
    "build,norms,experts",
    [
        (deepseek, 9, ["layers.1.mlp.experts"]),
        (mixtral, 5, ["layers.0.mlp.experts", "layers.1.mlp.experts"]),
    ],
    ids=["DeepseekV3", "Mixtral"],
)
def test_a_library_operator_outside_the_norms_leaves_them_read_and_the_call_unrecognised(
    build, norms, experts, tmp_path
):
    saved(build(), (torch.randint(0, 64, (2, 8)),), tmp_path / "m.pt2")
    inspection = inspect_path(tmp_path / "m.pt2")
    assert len(inspection.layers) == norms and all(layer.spec is not None for layer in inspection.layers)
    messages = unrecognised(inspection)
    assert sorted(messages) == experts
    assert all("transformers::grouped_mm_fallback" in m and "--allow-unrecognised" in m for m in messages.values())
    refused = invoke_cli("register", "m", "m.pt2", *store(tmp_path), cwd=tmp_path, columns=200)
    assert refused.returncode == 21 and "Traceback" not in refused.stderr, refused.stderr
    assert "re-export the model with torch.export.export" not in refused.stderr
    done = invoke_cli("register", "m", "m.pt2", "--allow-unrecognised", *store(tmp_path), cwd=tmp_path, columns=200)
    assert done.returncode == 0 and f"{norms}/{norms} normalization layers passed" in done.stdout, done.stderr
    from converters.torch_adapter.pt2.opaque_operators import OpaqueOperatorError

    with pytest.raises(OpaqueOperatorError, match="transformers::grouped_mm_fallback"):
        load_exported_program(tmp_path / "m.pt2").module()(torch.randint(0, 64, (2, 8)))


@torch.library.custom_op("nbtest::scaled", mutates_args=())
def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0


@_scaled.register_fake
def _(x):
    return torch.empty_like(x)


class RMSNormCallingAnOperator(nn.Module):
    """An RMSNorm whose normalised value goes through a library operator before its weight."""

    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x):
        return self.weight * _scaled(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class OperatorInsideAndOutside(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.outer = RMSNormCallingAnOperator(8), nn.LayerNorm(8)

    def forward(self, x):
        return self.outer(_scaled(self.inner(x)))


def test_a_normalization_calling_a_library_operator_is_unrecognised_and_one_outside_it_is_read(tmp_path):
    saved(R.randomise(OperatorInsideAndOutside()), (torch.randn(2, 3, 8),), tmp_path / "m.pt2")
    inspection = inspect_path(tmp_path / "m.pt2")
    assert [layer.path for layer in inspection.layers] == ["outer"] and inspection.layers[0].spec is not None
    messages = unrecognised(inspection)
    assert "inner" in messages and "it calls nbtest::scaled, which normbridge does not run" in messages["inner"]
