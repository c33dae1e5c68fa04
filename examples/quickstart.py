"""Quickstart: a PyTorch BatchNorm2d (eps 1e-3, momentum 0.01) to Keras and ONNX, its report, and `check`.

Run with `make demo`. Writes the converted layers to ./demo-out/.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cli.framework_noise import configure  # noqa: E402  (before any framework loads: TensorFlow's start-up lines)

configure(verbose=False)  # what the CLI does; the library leaves the host process alone (README, "make demo")

import torch
from rich.console import Console
from rich.rule import Rule

import converters
from converters import write_layer
from converters.onnx_adapter.files import save_onnx
from schemas import save_spec

console = Console()
OUT = Path("demo-out")


def trained_batchnorm() -> torch.nn.BatchNorm2d:
    """A BatchNorm2d whose running statistics have moved away from their initial values."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(8, eps=1e-3, momentum=0.01)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    bn.train()
    for _ in range(20):
        bn(torch.randn(16, 8, 6, 6) * 3.0 + 1.0)
    return bn.eval()


def main() -> int:
    bn = trained_batchnorm()
    spec = converters.to_spec(bn)
    console.print(Rule("source: torch.nn.BatchNorm2d(8, eps=1e-3, momentum=0.01)"))
    console.print(
        f"eps={spec.eps!r} momentum={spec.momentum!r} ({spec.momentum_convention}) num_batches_tracked={int(spec.tensors['num_batches_tracked'])}",
        markup=False,
        soft_wrap=True,
    )

    keras_layer, keras_report = converters.convert_with_report(bn, "keras")
    console.print(Rule("to Keras"))
    console.print(keras_report.render_text(), markup=False, highlight=False, soft_wrap=True)
    console.print(
        f"keras {type(keras_layer).__name__}: epsilon={keras_layer.epsilon!r} momentum={keras_layer.momentum!r} axis={keras_layer.axis}",
        markup=False,
        soft_wrap=True,
    )

    onnx_model, onnx_report = converters.convert_with_report(bn, "onnx", opset=23)
    console.print(Rule("to ONNX (opset 23)"))
    console.print(onnx_report.render_text(), markup=False, highlight=False, soft_wrap=True)
    back = converters.to_spec(onnx_model)
    console.print(
        f"read back from ONNX: eps={back.eps!r} momentum={back.momentum!r} ({back.momentum_convention})",
        markup=False,
        soft_wrap=True,
    )

    OUT.mkdir(exist_ok=True)
    save_spec(spec, OUT / "bn_spec")
    save_onnx(onnx_model, OUT / "bn.onnx")
    write_layer(keras_layer, spec, "keras", OUT / "bn.keras")
    console.print(f"wrote {OUT}/bn_spec, {OUT}/bn.onnx, {OUT}/bn.keras", markup=False, soft_wrap=True)

    console.print(Rule("check: torch -> keras/onnx/torch and back, against the NumPy reference"))
    result = converters.check(bn)
    console.print(result.render_text(), markup=False, highlight=False, soft_wrap=True)
    save_checkpoint_folder(OUT / "llama-tuned")
    return 0 if result.passed else 1


def save_checkpoint_folder(folder: Path) -> None:
    """A small Llama saved as a fine-tune is (`save_pretrained`: config.json and safetensors shards), for the README's
    `normbridge register llama-tuned demo-out/llama-tuned`; random weights, built offline from a config."""
    try:
        import transformers
    except ModuleNotFoundError:
        console.print(
            "transformers is not installed: no checkpoint folder written (pip install 'normbridge[huggingface]')"
        )
        return
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        rms_norm_eps=1e-5,
    )
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                module.weight.uniform_(0.5, 1.5)  # as after fine-tuning: scales of 1 hide what a norm does
    model.save_pretrained(folder, max_shard_size="100KB")
    console.print(
        f"wrote {folder}/ (a Llama checkpoint as save_pretrained writes it: config.json, "
        f"{len(list(folder.glob('*.safetensors')))} safetensors shards and their index)",
        markup=False,
        soft_wrap=True,
    )


if __name__ == "__main__":
    sys.exit(main())
