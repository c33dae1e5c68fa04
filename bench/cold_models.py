"""The models the cold-process benchmarks register and inspect, written to files once per run.

- `bn_stack(n)`: Conv2d(64) -> n x (BatchNorm2d(64), ReLU, Conv2d), trained statistics; n=53 is ResNet-50's
  BatchNorm count, n=1 the baseline the per-normalizer figure subtracts.
- `rms_decoder(blocks)`: a Llama-style decoder (RMSNorm before attention and before the MLP in every
  block), 2 x blocks RMSNorms; 80 blocks give the 160 normalizers of issue 15.
- keras.applications.ResNet50(weights=None): 53 BatchNormalizations.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F


def bn_stack(n: int) -> torch.nn.Module:
    """n BatchNorm2d(64) layers between 3x3 convolutions, statistics from one training batch, in eval mode."""
    layers: list[torch.nn.Module] = [torch.nn.Conv2d(3, 64, 3, padding=1)]
    for i in range(n):
        layers += [torch.nn.BatchNorm2d(64), torch.nn.ReLU()]
        if i < n - 1:
            layers.append(torch.nn.Conv2d(64, 64, 3, padding=1))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*layers).train()
    with torch.no_grad():
        model(torch.randn(4, 3, 16, 16))
    return model.eval()


class DecoderBlock(torch.nn.Module):
    def __init__(self, width: int, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.input_layernorm = torch.nn.RMSNorm(width, eps=1e-6)
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.o_proj = torch.nn.Linear(width, width, bias=False)
        self.post_attention_layernorm = torch.nn.RMSNorm(width, eps=1e-6)
        self.up_proj = torch.nn.Linear(width, 4 * width, bias=False)
        self.down_proj = torch.nn.Linear(4 * width, width, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.input_layernorm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.o_proj(attended)
        return x + self.down_proj(F.silu(self.up_proj(self.post_attention_layernorm(x))))


class Decoder(torch.nn.Module):
    def __init__(self, blocks: int, width: int = 64, vocabulary: int = 256):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocabulary, width)
        self.layers = torch.nn.ModuleList(DecoderBlock(width) for _ in range(blocks))
        self.lm_head = torch.nn.Linear(width, vocabulary, bias=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)


def rms_decoder(blocks: int = 80) -> torch.nn.Module:
    """The decoder with RMSNorm scales away from their initial ones, in eval mode."""
    torch.manual_seed(0)
    model = Decoder(blocks).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.RMSNorm):
                module.weight.uniform_(0.5, 1.5)
    return model


def save_pt2(model: torch.nn.Module, example: tuple, path: Path) -> Path:
    torch.export.save(torch.export.export(model, example), str(path))
    return path


def write_models(folder: Path) -> dict[str, Path]:
    """name -> file: the .pt2 models, their state dicts as safetensors (what MLflow's process loads),
    and the .keras ResNet50."""
    from safetensors.torch import save_file

    files = {}
    for n in (1, 53):
        model = bn_stack(n)
        files[f"bn{n}"] = save_pt2(model, (torch.randn(2, 3, 16, 16),), folder / f"bn{n}.pt2")
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / f"bn{n}.safetensors"))
        files[f"bn{n}_state"] = folder / f"bn{n}.safetensors"
    files["rms160"] = save_pt2(rms_decoder(80), (torch.zeros(1, 8, dtype=torch.long),), folder / "rms160.pt2")
    files["resnet50"] = folder / "resnet50.keras"
    keras_script = (
        "import os, sys; os.environ.setdefault('KERAS_BACKEND', 'tensorflow'); import keras; "
        "keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3)).save(sys.argv[1])"
    )
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", keras_script, str(files["resnet50"])], check=True, capture_output=True)
    return files
