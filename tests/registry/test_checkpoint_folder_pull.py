"""A registered Hugging Face checkpoint folder comes back whole: `pull` writes the folder `from_pretrained` loads.

Every file of the folder comes back byte-identical (config, tokenizer and other kept files, the index, each shard:
compared byte for byte with the saved ones), the model transformers loads from the pulled folder computes exactly what
the saved model computes, `Registry.load` gives that model, and the same holds over HTTP (`register --server` sends
only the blobs the server lacks; `pull --server` writes the folder). A tampered blob stops the pull with nothing
written; an existing folder is never overwritten; a bundle's folder structure is checked before it is stored.
Nothing comes from a hub (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from converters.adapters import REGISTRY  # noqa: E402
from registry.service import Registry  # noqa: E402
from schemas.errors import InputFileError, IntegrityError, OutputPathError, RegistryError  # noqa: E402
from tests.cli_run import invoke_cli  # noqa: E402
from tests.converters.test_checkpoint_folder import _saved  # noqa: E402

TOKENS = torch.arange(12, dtype=torch.long).reshape(2, 6) % 64
KEPT = {
    "tokenizer.json": '{"version": "1.0", "model": {"vocab": {"a": 0}}}\n',
    "generation_config.json": '{"bos_token_id": 1, "eos_token_id": 2}\n',
    "notes/README.md": "fine-tuned for tests\n",
}


def _registry(tmp_path: Path) -> Registry:
    return Registry(db=f"sqlite:///{tmp_path / 'registry.db'}", blobs=str(tmp_path / "blobs"), user="tester")


def _checkpoint(case: str, folder: Path):
    """A saved checkpoint with the files a fine-tune keeps beside its weights; the model saved."""
    model = _saved(case, folder)
    for name, text in KEPT.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return model


def _files(folder: Path) -> dict[str, bytes]:
    return {
        path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()
    }


def _outputs(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        output = model.eval()(inputs)
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


@pytest.mark.parametrize(
    "case", ["llama-bf16-one-file", "gemma2-bf16-sharded", "qwen3-f32-one-file", "detr-f32-sharded"]
)
def test_a_pulled_folder_is_the_registered_one_byte_for_byte_and_loads(case, tmp_path):
    model = _checkpoint(case, tmp_path / "checkpoint")
    registry = _registry(tmp_path)
    registry.register("tuned", tmp_path / "checkpoint")

    pulled = registry.pull("tuned@1", tmp_path / "pulled")

    assert pulled.path == str(tmp_path / "pulled") and pulled.format == "hf-folder"
    assert _files(tmp_path / "pulled") == _files(tmp_path / "checkpoint")
    assert pulled.nbytes == sum(len(data) for data in _files(tmp_path / "checkpoint").values())
    loaded, source = (type(model).from_pretrained(tmp_path / folder) for folder in ("pulled", "checkpoint"))
    inputs = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(1)) if case.startswith("detr") else TOKENS
    assert torch.equal(_outputs(loaded, inputs), _outputs(source, inputs))
    if not case.startswith(
        "detr"
    ):  # the saved tensors are the model's (a bfloat16 model's rotary buffers are not saved)
        assert all(
            torch.equal(value, model.state_dict()[name])
            for name, value in loaded.state_dict().items()
            if name in model.state_dict()
        )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pulled")]  # no staging folder left


def test_registry_load_gives_the_architectures_class_computing_the_same(tmp_path):
    _checkpoint("qwen3-f32-one-file", tmp_path / "checkpoint")
    registry = _registry(tmp_path)
    registry.register("qwen", tmp_path / "checkpoint")

    loaded = registry.load("qwen@1")

    assert type(loaded) is transformers.Qwen3ForCausalLM and not loaded.training
    source = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "checkpoint").eval()
    with torch.no_grad():
        assert torch.equal(loaded(TOKENS).logits, source(TOKENS).logits)


def test_a_recalibrated_version_stores_its_statistics_and_pulls_as_its_own_folder(tmp_path):
    model = _checkpoint("resnet-f32-one-file", tmp_path / "v1")
    registry = _registry(tmp_path)
    registry.register("resnet", tmp_path / "v1")
    recalibrated = copy.deepcopy(model)
    with torch.no_grad():
        for module in recalibrated.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_var.mul_(1.5)
    recalibrated.save_pretrained(tmp_path / "v2")
    for name, text in KEPT.items():
        (tmp_path / "v2" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "v2" / name).write_text(text)
    registry.register("resnet", tmp_path / "v2", parent="resnet@1")

    registry.pull("resnet@1", tmp_path / "back1")
    registry.pull("resnet@2", tmp_path / "back2")

    assert _files(tmp_path / "back1") == _files(tmp_path / "v1")
    assert _files(tmp_path / "back2") == _files(tmp_path / "v2")
    assert _files(tmp_path / "back1")["model.safetensors"] != _files(tmp_path / "back2")["model.safetensors"]


def test_a_pull_never_overwrites_and_goes_inside_an_existing_folder(tmp_path):
    _checkpoint("llama-bf16-one-file", tmp_path / "checkpoint")
    registry = _registry(tmp_path)
    registry.register("llama", tmp_path / "checkpoint")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "other.txt").write_text("kept")
    (tmp_path / "empty").mkdir()

    inside = registry.pull("llama@1", tmp_path / "models")
    into_empty = registry.pull("llama@1", tmp_path / "empty")

    assert inside.path == str(tmp_path / "models" / "llama-1")
    assert _files(tmp_path / "models" / "llama-1") == _files(tmp_path / "checkpoint")
    assert (tmp_path / "models" / "other.txt").read_text() == "kept"
    assert _files(tmp_path / "empty") == _files(tmp_path / "checkpoint")
    with pytest.raises(OutputPathError, match="already exists"):
        registry.pull("llama@1", tmp_path / "models")
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(OutputPathError, match="already exists"):
        registry.pull("llama@1", tmp_path / "a-file")
    with pytest.raises(RegistryError, match="folder, not one file"):
        registry.model_file("llama@1")
    assert (tmp_path / "a-file").read_text() == "x"


def test_a_tampered_blob_stops_the_pull_and_leaves_nothing(tmp_path):
    _checkpoint("llama-bf16-one-file", tmp_path / "checkpoint")
    registry = _registry(tmp_path)
    registry.register("llama", tmp_path / "checkpoint")
    manifest = registry.manifest("llama@1")
    digest = manifest.tensors["layers.0.mlp.down_proj.weight"].digest
    blob = tmp_path / "blobs" / digest[:2] / digest[2:]
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))

    with pytest.raises(IntegrityError):
        registry.pull("llama@1", tmp_path / "pulled")

    assert not (tmp_path / "pulled").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".pulled")] == []


def test_the_pull_command_writes_the_folder(tmp_path):
    _checkpoint("gemma2-bf16-sharded", tmp_path / "checkpoint")
    where = ["--db", f"sqlite:///{tmp_path / 'registry.db'}", "--blobs", str(tmp_path / "blobs")]
    registered = invoke_cli("register", "gemma", "checkpoint", *where, cwd=tmp_path)
    assert registered.returncode == 0, registered.stdout + registered.stderr

    pulled = invoke_cli("pull", "gemma@1", "-o", "served", *where, cwd=tmp_path)
    refused = invoke_cli("pull", "gemma@1", "-o", "x.pt2", "--format", "pt2", *where, cwd=tmp_path)

    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert "gemma@1 -> " in pulled.stdout and "hf-folder" in pulled.stdout
    assert _files(tmp_path / "served") == _files(tmp_path / "checkpoint")
    assert refused.returncode != 0 and "registered as a folder (hf-folder)" in refused.stdout + refused.stderr


# -- a folder structure that arrives in a bundle is checked before anything is stored -----------------------------


@pytest.fixture(scope="module")
def folder_parts(tmp_path_factory):
    """(parts, tensors) of a registered folder's structure, as a bundle would carry them."""
    root = tmp_path_factory.mktemp("parts")
    _checkpoint("llama-f32-sharded", root / "checkpoint")
    registry = _registry(root)
    registry.register("llama", root / "checkpoint")
    manifest = registry.manifest("llama@1")
    from registry.structure import structure_parts

    parts = structure_parts(manifest, registry.blob_reader(registry.show("llama@1")))
    return parts, {name: (ref.dtype, ref.shape) for name, ref in manifest.tensors.items()}


def _check(parts, tensors):
    REGISTRY.model_adapter("torch").check_model_folder(parts, tensors)


def test_the_registered_structure_passes_its_own_check(folder_parts):
    _check(*folder_parts)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p.update({"files/../escape.txt": b"x"}), "outside the folder"),
        (lambda p: p.update({"files/weights.bin": b"x"}), "pickle or code"),
        (lambda p: p.update({"files/modeling_evil.py": b"import os"}), "pickle or code"),
        (
            lambda p: p.update(
                {"files/config.json": json.dumps({"model_type": "llama", "auto_map": {"AutoModel": "x.Y"}}).encode()}
            ),
            "auto_map",
        ),
        (lambda p: p.pop("files/config.json"), "no config.json"),
        (lambda p: p.update({"stray": b"x"}), "does not use"),
        (lambda p: p.update({"layout.json": b"[]"}), "not a hf-folder layout"),
    ],
)
def test_a_hostile_structure_is_refused(folder_parts, change, message):
    parts, tensors = folder_parts
    hostile = dict(parts)
    change(hostile)
    with pytest.raises(InputFileError, match=message):
        _check(hostile, tensors)


def test_a_layout_that_writes_a_tensor_the_version_lacks_or_with_another_shape_is_refused(folder_parts):
    parts, tensors = folder_parts
    layout = json.loads(parts["layout.json"])
    first = layout["shards"][0]["tensors"][0]
    renamed = copy.deepcopy(layout)
    renamed["shards"][0]["tensors"][0] = [first[0], "not.a.tensor"]
    with pytest.raises(InputFileError, match="does not hold"):
        _check({**parts, "layout.json": json.dumps(renamed).encode()}, tensors)
    reshaped = dict(tensors)
    dtype, shape = reshaped[first[1]]
    reshaped[first[1]] = (dtype, [*shape, 1])
    with pytest.raises(InputFileError, match="the version holds"):
        _check(parts, reshaped)
    dropped = copy.deepcopy(layout)
    dropped["shards"][0]["tensors"] = dropped["shards"][0]["tensors"][1:]
    with pytest.raises(InputFileError, match="does not hold it there|does not write"):
        _check({**parts, "layout.json": json.dumps(dropped).encode()}, tensors)


# -- architectures `torch.export` cannot carry (MoE), and vision families:
#    registered and given back from their folders --


def _mixtral():
    return transformers.MixtralForCausalLM(
        transformers.MixtralConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            rms_norm_eps=2e-6,
        )
    )


def _qwen2_moe():
    return transformers.Qwen2MoeForCausalLM(
        transformers.Qwen2MoeConfig(
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=64,
            num_experts=4,
            num_experts_per_tok=2,
        )
    )


def _deepseek_v3():
    """DeepSeek-V3's MoE program holds transformers' custom op `grouped_mm_fallback` once exported (issue 34 item 4);
    its folder has no program: its q_a/kv_a norms and the rest are read and gated from the files."""
    return transformers.DeepseekV3ForCausalLM(
        transformers.DeepseekV3Config(
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            vocab_size=64,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
        )
    )


def _vit():
    return transformers.ViTModel(
        transformers.ViTConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=32,
            patch_size=8,
            layer_norm_eps=3e-6,
        ),
        add_pooling_layer=False,
    )


def _convnext():
    """ConvNeXt's channels-first LayerNorm (a hand-written class) beside stock ones."""
    return transformers.ConvNextModel(
        transformers.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, layer_norm_eps=2e-6)
    )


#: builder, inputs, norms the folder must hold (at least), shard size.
FAMILIES = {
    "mixtral": (_mixtral, TOKENS, 5, "40KB"),
    "qwen2-moe": (_qwen2_moe, TOKENS, 5, "40KB"),
    "deepseek-v3": (_deepseek_v3, TOKENS, 9, "40KB"),
    "vit": (_vit, torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3)), 5, None),
    "convnext": (_convnext, torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(4)), 5, "8KB"),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_family_folder_is_gated_norm_by_norm_and_comes_back_loading(family, tmp_path):
    from tests.real_norms import randomise

    build, inputs, norms, shard = FAMILIES[family]
    torch.manual_seed(0)
    model = randomise(build(), seed=5)
    model.save_pretrained(tmp_path / "checkpoint", **({"max_shard_size": shard} if shard else {}))
    registry = _registry(tmp_path)

    done = registry.register(family, tmp_path / "checkpoint")
    registry.pull(f"{family}@1", tmp_path / "pulled")

    from converters.models.inspection import inspect_path

    listed = [layer.path for layer in inspect_path(tmp_path / "checkpoint").layers]
    assert len(listed) >= norms and sorted(spec.name for spec in registry.specs(f"{family}@1")) == sorted(listed)
    assert len(done.checks) == len(listed) and all(check.passed for check in done.checks)
    assert _files(tmp_path / "pulled") == _files(tmp_path / "checkpoint")
    loaded = registry.load(f"{family}@1")
    source = type(model).from_pretrained(tmp_path / "checkpoint")
    assert type(loaded) is type(model)
    assert torch.equal(_outputs(loaded, inputs), _outputs(source, inputs))


def test_a_projection_only_fine_tune_stores_only_the_projections_and_diff_names_them(tmp_path):
    """A LoRA merged into the attention projections changes those tensors alone: they are all the second version adds,
    and `diff` says the weights changed and no normalization did."""
    model = _checkpoint("llama-f32-sharded", tmp_path / "v1")
    registry = _registry(tmp_path)
    registry.register("llama", tmp_path / "v1")
    blobs = {path for path in (tmp_path / "blobs").rglob("*") if path.is_file()}
    merged = copy.deepcopy(model)
    adapted = [name for name, _ in merged.named_parameters() if name.endswith(("q_proj.weight", "v_proj.weight"))]
    with torch.no_grad():
        for name in adapted:
            weight = merged.get_parameter(name)
            weight.add_(
                torch.outer(torch.linspace(-0.1, 0.1, weight.shape[0]), torch.linspace(0.2, -0.2, weight.shape[1]))
            )
    merged.save_pretrained(tmp_path / "v2", max_shard_size="20KB")
    for name, text in KEPT.items():
        (tmp_path / "v2" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "v2" / name).write_text(text)

    registry.register("llama", tmp_path / "v2", parent="llama@1")

    added = {path for path in (tmp_path / "blobs").rglob("*") if path.is_file()} - blobs
    assert len(added) == len(adapted)  # the projections' blobs: no norm, no other weight, no structure part
    diff = registry.diff("llama@1", "llama@2")
    assert not diff.weights_identical and not diff.statistics_changed_layers
    assert {change.name for change in diff.tensors if change.status == "changed"} == set(adapted)
    registry.pull("llama@2", tmp_path / "back")
    assert _files(tmp_path / "back") == _files(tmp_path / "v2")


FULL_DISK_PULL = """
import resource, signal, sys
from registry.service import Registry
from schemas.errors import OutputPathError

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as a full disk's with ENOSPC
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
registry = Registry(db=f"sqlite:///{sys.argv[1]}/registry.db", blobs=f"{sys.argv[1]}/blobs", user="tester")
try:
    registry.pull("llama@1", sys.argv[2])
except OutputPathError as error:
    print(error)
    sys.exit(24)
"""


def test_a_pull_the_disk_refuses_is_an_error_naming_the_folder_and_leaves_nothing(tmp_path):
    """The disk refuses a write halfway through a shard (a file-size limit in a child process stands for a full disk):
    the pull fails with an OutputPathError naming the folder, and neither the folder nor its staging sibling is left."""
    import subprocess
    import sys

    _checkpoint("llama-bf16-one-file", tmp_path / "checkpoint")
    _registry(tmp_path).register("llama", tmp_path / "checkpoint")
    shard = (tmp_path / "checkpoint" / "model.safetensors").stat().st_size
    out = tmp_path / "out"
    out.mkdir()

    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK_PULL, str(tmp_path), str(out / "pulled"), str(shard // 2)],
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 24, done.stdout + done.stderr
    assert f"cannot write '{out / 'pulled'}'" in done.stdout, done.stdout
    assert list(out.iterdir()) == []  # no folder, no staging folder
