"""Normalizations as real models write them: tiny transformers models (random init, no hub) and replicas of
torchvision's and timm's classes (they do not import beside this torch build), written from their documented formulas.

Every builder gives each normalization a random state (identity statistics hide most bugs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every 1-D floating parameter and buffer drawn from U(0.5, 1.5) (positive: they may be variances); eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for tensor in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
                if tensor.is_floating_point() and tensor.dim() == 1:
                    tensor.copy_(
                        torch.rand(tensor.shape, generator=generator, dtype=torch.float64).to(tensor.dtype) + 0.5
                    )
    return model.eval()


# -- transformers ------------------------------------------------------------------------


def _decoder(config_name: str, model_name: str, **extra):
    import transformers

    config = getattr(transformers, config_name)(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        **extra,
    )
    return getattr(transformers, model_name)(config)


def llama():
    return _decoder("LlamaConfig", "LlamaModel", rms_norm_eps=3e-6)


def qwen2():
    return _decoder("Qwen2Config", "Qwen2Model", rms_norm_eps=2e-6)


def qwen3():
    """Qwen3's q_norm and k_norm normalize each head of a view the attention makes: `q_norm(q_proj(x).view(...))`."""
    return _decoder("Qwen3Config", "Qwen3Model", rms_norm_eps=2.5e-6, head_dim=8)


def mamba():
    """Mamba's MambaRMSNorm, whose input cast the block reuses for its float32 residual."""
    from transformers import MambaConfig, MambaModel

    return MambaModel(
        MambaConfig(
            hidden_size=32,
            state_size=8,
            num_hidden_layers=2,
            vocab_size=64,
            layer_norm_epsilon=6e-6,
            residual_in_fp32=True,
        )
    )


def mistral():
    return _decoder("MistralConfig", "MistralModel", rms_norm_eps=4e-6)


def gemma():
    return _decoder("GemmaConfig", "GemmaModel", rms_norm_eps=5e-6, head_dim=8)


def t5():
    from transformers import T5Config, T5Model

    return T5Model(
        T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=64, layer_norm_epsilon=7e-6)
    )


def convnext():
    from transformers import ConvNextConfig, ConvNextModel

    model = ConvNextModel(ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, layer_norm_eps=2e-6))
    for module in model.modules():
        if type(module).__name__ == "ConvNextLayerNorm":
            module.eps = 3e-6  # transformers hard-codes 1e-6 there: another value shows a default misread as eps
    return model


def convnextv2():
    from transformers import ConvNextV2Config, ConvNextV2Model

    model = ConvNextV2Model(ConvNextV2Config(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, layer_norm_eps=2e-6))
    for module in model.modules():
        if type(module).__name__ == "ConvNextV2LayerNorm":
            module.eps = 3e-6
    return model


def detr():
    from transformers import DetrConfig, DetrModel, ResNetConfig

    backbone = ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", out_features=["stage2"]
    )
    return DetrModel(
        DetrConfig(
            use_timm_backbone=False,
            use_pretrained_backbone=False,
            backbone_config=backbone,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            num_queries=5,
        )
    )


# -- replicas ------------------------------------------------------------------------------


class FrozenBatchNorm2d(nn.Module):
    """torchvision.ops.misc.FrozenBatchNorm2d: four buffers, `x * scale + (b - rm * scale)`,
    scale = w * rsqrt(rv + eps)."""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x):
        w, b = self.weight.reshape(1, -1, 1, 1), self.bias.reshape(1, -1, 1, 1)
        rv, rm = self.running_var.reshape(1, -1, 1, 1), self.running_mean.reshape(1, -1, 1, 1)
        scale = w * (rv + self.eps).rsqrt()
        return x * scale + (b - rm * scale)


class LayerNorm2d(nn.LayerNorm):
    """timm.layers.LayerNorm2d: LayerNorm over the channels of an NCHW tensor (permute, F.layer_norm, permute back)."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class BatchNormAct2d(nn.BatchNorm2d):
    """timm.layers.BatchNormAct2d: BatchNorm2d (F.batch_norm with its own arguments) followed by an activation."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__(num_features, eps=eps, momentum=momentum)
        self.drop = nn.Identity()
        self.act = nn.ReLU()

    def forward(self, x):
        use_batch = self.training or self.running_mean is None
        x = F.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, use_batch, self.momentum, self.eps
        )
        return self.act(self.drop(x))


class RmsNorm(nn.Module):
    """timm.layers.RmsNorm: a weight, eps and F.rms_norm over the trailing normalized_shape."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.normalized_shape = (channels,)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels))

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class FunctionalLayerNorm(nn.Module):
    """A user's module that keeps its own weight and bias and calls F.layer_norm in forward."""

    def __init__(self, dim: int, eps: float = 1e-4):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim)), eps

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class WrittenOutLayerNorm(nn.Module):
    """LayerNorm with its statistics written out: (x - mean) / sqrt(var + eps) * w + b."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim)), eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class ChannelsFirstLayerNorm(nn.Module):
    """The original ConvNeXt repository's LayerNorm for data_format="channels_first",
    its statistics written out over axis 1."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(channels)), nn.Parameter(torch.zeros(channels)), eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


# -- near misses: they look like normalizations and compute something else ---------------------


class EpsOutsideNorm(nn.Module):
    """x / (sqrt(mean(x^2)) + eps): eps outside the square root, not an RMSNorm."""

    def __init__(self, dim: int, eps: float = 1e-3):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        return x / (torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + self.eps) * self.weight


class UnbiasedLayerNorm(WrittenOutLayerNorm):
    """A LayerNorm with the unbiased variance (n - 1): no normalization kind computes that."""

    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class PowNorm(nn.Module):
    """An RMSNorm spelled with pow(-0.5) and its own attribute names: the tracer does not read it, a declaration can."""

    def __init__(self, dim: int, tiny: float = 1e-5):
        super().__init__()
        self.gain, self.tiny = nn.Parameter(torch.ones(dim)), tiny

    def forward(self, x):
        return x * torch.pow(x.pow(2).mean(-1, keepdim=True) + self.tiny, -0.5) * self.gain
