"""A Llama-shaped random bfloat16 Hugging Face checkpoint folder for bench/checkpoints.py, never held whole in memory.

The tensor names and shapes come from `transformers.LlamaForCausalLM(config)` built on the meta device; each shard is
then filled with random values and written by `safetensors.torch.save_file`, as `save_pretrained` writes it (the
index in transformers' format, `config.json`, `generation_config.json`), beside a real byte-level BPE tokenizer
(`tokenizer.json`, about 2 MB) so that MLflow's transformers flavour can load the folder's tokenizer.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import torch

NORM_SUFFIX = "norm.weight"  # input_layernorm, post_attention_layernorm and the final model.norm


def llama_config(layers: int, tiny: bool = False):
    """A 1B-class Llama's widths with `layers` decoder layers (8: about 1 GB in bfloat16); `tiny`: widths of 64, a
    vocabulary of 512 (under 1 MB: what a registration costs whatever the size)."""
    from transformers import LlamaConfig

    widths = (
        dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
        if tiny
        else dict(
            hidden_size=2048, intermediate_size=5632, num_attention_heads=16, num_key_value_heads=4, vocab_size=32000
        )
    )
    return LlamaConfig(
        num_hidden_layers=layers,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        architectures=["LlamaForCausalLM"],
        **widths,
    )


def shapes(config) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor `save_pretrained` would write, from the model built on the meta device."""
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def random_tensor(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """bf16 values: RMSNorm weights about 1 (as a trained model's), every other weight about N(0, 0.02)."""
    values = torch.randn(shape, generator=generator, dtype=torch.float32)
    if name.endswith(NORM_SUFFIX):
        return (1.0 + 0.1 * values).to(torch.bfloat16)
    return values.mul_(0.02).to(torch.bfloat16)


def write_shards(folder: Path, names: dict[str, tuple[int, ...]], shard_bytes: int, seed: int = 0) -> int:
    """The shards and their index; returns the tensors' total bytes. One shard's tensors at a time in memory."""
    from safetensors.torch import save_file

    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in names.items():
        nbytes = 2 * int(torch.Size(shape).numel())
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    generator = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for index, group in enumerate(groups, 1):
        file = f"model-{index:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: random_tensor(name, names[name], generator) for name in group}
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        del tensors
        weight_map.update(dict.fromkeys(group, file))
    index_json = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2, sort_keys=True) + "\n")
    return total


def write_tokenizer(folder: Path, vocab_size: int, seed: int = 0) -> None:
    """A byte-level BPE tokenizer of `vocab_size` tokens, its merges building random longer tokens (2.5 MB of JSON)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: i for i, token in enumerate(sorted(alphabet))}
    tokens, merges = list(vocab), []
    while len(vocab) < vocab_size - 3:
        left, right = rng.choice(tokens[:4000] or tokens), rng.choice(tokens[:400])
        merged = left + right
        if merged in vocab or len(merged) > 16:
            continue
        vocab[merged] = len(vocab)
        tokens.append(merged)
        merges.append((left, right))
    for special in ("<s>", "</s>", "<unk>"):
        vocab[special] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(str(folder))


def build_folder(folder: Path, layers: int, shard_megabytes: int, tiny: bool = False) -> int:
    """Write the checkpoint folder; returns the tensors' total bytes."""
    from transformers import GenerationConfig

    folder.mkdir(parents=True)
    config = llama_config(layers, tiny)
    total = write_shards(folder, shapes(config), shard_megabytes * 1_000_000)
    config.save_pretrained(str(folder))
    special = config.vocab_size - 3  # <s>, </s>, <unk>: the tokenizer's last three ids
    GenerationConfig(bos_token_id=special, eos_token_id=special + 1, max_new_tokens=32).save_pretrained(str(folder))
    write_tokenizer(folder, config.vocab_size)
    return total


def header(file: Path) -> tuple[int, dict]:
    """(byte where the data section starts, the header's JSON) of a safetensors file."""
    with open(file, "rb") as stream:
        (length,) = struct.unpack("<Q", stream.read(8))
        return 8 + length, json.loads(stream.read(length))


def recalibrate(folder: Path, seed: int = 1) -> tuple[int, int]:
    """Rewrite, in place, only the RMSNorm weights' bytes of every shard (header and every other byte kept): a
    recalibration. Returns (tensors changed, bytes changed)."""
    generator = torch.Generator().manual_seed(seed)
    changed = changed_bytes = 0
    for file in sorted(folder.glob("*.safetensors")):
        start, entries = header(file)
        with open(file, "r+b") as stream:
            for name, entry in entries.items():
                if name == "__metadata__" or not name.endswith(NORM_SUFFIX):
                    continue
                begin, end = entry["data_offsets"]
                values = random_tensor(name, tuple(entry["shape"]), generator)
                data = values.view(torch.int16).numpy().tobytes()
                assert len(data) == end - begin, name
                stream.seek(start + begin)
                stream.write(data)
                changed += 1
                changed_bytes += len(data)
    return changed, changed_bytes
