"""A Hugging Face checkpoint folder inspects as a .pt2 of the same model does (torch_adapter/checkpoint_folder/).

Each row builds a transformers model from a small config (random init, every normalization given a random state), saves
it with `save_pretrained` (one file, or shards with their index) in float32 or bfloat16, and exports the same model with
torch.export: `inspect` of the folder must list the same normalization layers (paths, kinds, classes, specs: eps,
dtype, affine and statistics settings; running statistics; hazards) as `inspect` of the `.pt2`. Nothing comes from a
hub (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from converters.models.inspection import inspect_model  # noqa: E402
from converters.models.loading import load_model  # noqa: E402
from tests.cli_run import invoke_cli  # noqa: E402
from tests.real_norms import randomise  # noqa: E402


def _decoder(config_name: str, model_name: str, **extra):
    config = getattr(transformers, config_name)(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        use_cache=False,
        **extra,
    )
    return getattr(transformers, model_name)(config)


def llama():
    return _decoder("LlamaConfig", "LlamaModel", rms_norm_eps=3e-6)


def gemma2():
    """Gemma's RMSNorm scales by 1 + weight, and Gemma2 adds norms before and after each feed-forward."""
    return _decoder("Gemma2Config", "Gemma2Model", rms_norm_eps=5e-6, head_dim=8)


def qwen3():
    """Qwen3's q_norm and k_norm normalize each attention head."""
    return _decoder("Qwen3Config", "Qwen3ForCausalLM", rms_norm_eps=2.5e-6, head_dim=8)


def bert():
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=64,
        layer_norm_eps=4e-12,
    )
    return BertModel(config, add_pooling_layer=False)


def resnet():
    """BatchNorm2d with running statistics (and a count: statistics that were updated)."""
    from transformers import ResNetConfig, ResNetModel

    model = ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"))
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.num_batches_tracked.fill_(9)
    return model


def detr():
    """DETR's backbone: transformers' ResNet with frozen BatchNorms (a hand-written class), saved under other names
    (`backbone.conv_encoder.model.` for the module's `backbone.model.`): read through transformers' renaming."""
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


TOKENS = (torch.arange(6, dtype=torch.long).reshape(1, 6),)
PIXELS = (torch.zeros(1, 3, 32, 32),)

#: (builder, dtype, max_shard_size or None for one file, example inputs of the export).
CASES = {
    "llama-f32-sharded": (llama, torch.float32, "20KB", TOKENS),
    "llama-bf16-one-file": (llama, torch.bfloat16, None, TOKENS),
    "gemma2-bf16-sharded": (gemma2, torch.bfloat16, "20KB", TOKENS),
    "qwen3-f32-one-file": (qwen3, torch.float32, None, TOKENS),
    "bert-f32-sharded": (bert, torch.float32, "30KB", TOKENS),
    "resnet-f32-one-file": (resnet, torch.float32, None, PIXELS),
    "resnet-bf16-sharded": (resnet, torch.bfloat16, "4KB", PIXELS),
    "detr-f32-sharded": (detr, torch.float32, "50KB", (torch.zeros(1, 3, 64, 64),)),
}


def _saved(case: str, folder: Path):
    build, dtype, shard, _ = CASES[case]
    torch.manual_seed(0)
    model = randomise(build().to(dtype), seed=3)
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    assert (folder / "model.safetensors.index.json").is_file() == (shard is not None)
    return model


def _layers(inspection) -> list[dict]:
    """What both inspections must agree on per layer, by path. Where they may differ is where a module and a program
    differ, whatever their source: the spec's `source` says which was read, `input_rank` is what a program's graph
    records of the input (a module does not say), and a module lists its layers in definition order, a program in
    execution order (Qwen3's q/k norms are defined before, and run after, the input norm)."""
    return sorted(
        (
            {
                "path": layer.path,
                "kind": layer.kind,
                "layer_type": layer.layer_type,
                "mode": layer.mode,
                "spec": {k: v for k, v in (layer.spec or {}).items() if k not in ("source", "input_rank")},
                "stats": layer.stats,
                "hazards": sorted(h.code for h in layer.hazards),
            }
            for layer in inspection.layers
        ),
        key=lambda layer: layer["path"],
    )


#: The .pt2 reader (not the folder's) reads a bfloat16 program's BatchNorm as float32 and calls it unreadable
#: ("tensor 'scale' has dtype bfloat16, expected the spec dtype float32"): the row stays, strict, until that is fixed.
PT2_CANNOT_READ = {"resnet-bf16-sharded"}
#: Rows whose program holds a layer the .pt2 reader finds but reads no spec from: compared by path and kind. DETR's
#: decoder starts from zero queries, and its program's first self-attention LayerNorm is left decomposed.
PT2_READS_LESS = {"detr-f32-sharded"}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            case, marks=pytest.mark.xfail(strict=True, reason="the .pt2 reader finds a bf16 BatchNorm unreadable")
        )
        if case in PT2_CANNOT_READ
        else case
        for case in CASES
    ],
)
def test_a_folder_inspects_as_a_pt2_of_the_same_model(case, tmp_path):
    model = _saved(case, tmp_path / "checkpoint")
    program = torch.export.export(model, CASES[case][3])
    torch.export.save(program, tmp_path / "model.pt2")

    from_folder = inspect_model(load_model(tmp_path / "checkpoint", checkpoint_folders=True), source="folder")
    from_pt2 = inspect_model(load_model(tmp_path / "model.pt2"), source="pt2")

    assert from_folder.layers, "no normalization found"
    if case in PT2_READS_LESS:
        assert sorted((layer.path, layer.kind) for layer in from_folder.layers) == sorted(
            (layer.path, layer.kind) for layer in from_pt2.layers
        )
        return
    assert _layers(from_folder) == _layers(from_pt2)
    assert sorted(h.code for h in from_folder.hazards) == sorted(h.code for h in from_pt2.hazards)
    dtype = str(CASES[case][1]).removeprefix("torch.")
    assert {layer.spec["dtype"] for layer in from_folder.layers} == {dtype}


@pytest.mark.parametrize("case", list(CASES))
def test_a_folder_inspects_as_the_model_saved_in_it(case, tmp_path):
    """The same recognizers read the same modules: everything alike, order and input rank included."""
    model = _saved(case, tmp_path / "checkpoint")

    from_folder = inspect_model(load_model(tmp_path / "checkpoint", checkpoint_folders=True), source="model")
    from_module = inspect_model(model, source="model")

    assert from_folder.layers
    assert from_folder.to_json() == from_module.to_json()


@pytest.mark.parametrize("case", ["llama-f32-sharded", "resnet-bf16-sharded"])
def test_only_the_normalizations_tensors_are_read_and_they_are_the_saved_ones(case, tmp_path):
    from converters.torch_adapter.checkpoint_folder.meta_model import norm_modules

    saved = _saved(case, tmp_path / "checkpoint")
    loaded = load_model(tmp_path / "checkpoint", checkpoint_folders=True)

    norms = {path for path, _ in norm_modules(loaded)}
    assert norms
    saved_state = saved.state_dict()
    for name, tensor in loaded.state_dict().items():
        owner = name.rsplit(".", 1)[0]
        if owner in norms:
            assert not tensor.is_meta and tensor.dtype == saved_state[name].dtype
            assert torch.equal(tensor, saved_state[name]), name  # bit-identical: read from its byte range
        else:
            assert tensor.is_meta, f"{name} was read, but is no normalization's"


def test_inspect_command_lists_a_sharded_folder_like_its_pt2(tmp_path):
    model = _saved("gemma2-bf16-sharded", tmp_path / "checkpoint")
    torch.export.save(torch.export.export(model, TOKENS), tmp_path / "model.pt2")

    folder = invoke_cli("inspect", "checkpoint", "--json", cwd=tmp_path)
    pt2 = invoke_cli("inspect", "model.pt2", "--json", cwd=tmp_path)

    assert folder.returncode == 0, folder.stderr
    listed = sorted(
        (layer["path"], layer["kind"], layer["spec"]["eps"], layer["spec"]["dtype"])
        for layer in json.loads(folder.stdout)["layers"]
    )
    assert listed == sorted(
        (layer["path"], layer["kind"], layer["spec"]["eps"], layer["spec"]["dtype"])
        for layer in json.loads(pt2.stdout)["layers"]
    )
    assert {kind for _, kind, _, _ in listed} == {"rms"} and len(listed) == 2 * 4 + 1
