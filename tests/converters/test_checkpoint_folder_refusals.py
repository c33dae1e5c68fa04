"""Hostile and broken Hugging Face checkpoint folders: each refused with one line naming the file and what to do.

Every row starts from a valid folder (`save_pretrained` of a small Llama) and breaks one thing; `normbridge inspect`
must exit with bad_input_file (6) and one line, and `register` must store nothing. The absurd config is refused without
allocating: its peak resident memory is measured in a child process against a valid folder's.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from schemas import InputFileError  # noqa: E402
from tests.cli_run import invoke_cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _llama(folder: Path, shard: str | None = None) -> Path:
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    model = LlamaModel(
        LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=64,
        )
    )
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    return folder


@pytest.fixture(scope="module")
def one_file(tmp_path_factory) -> Path:
    return _llama(tmp_path_factory.mktemp("valid") / "one-file")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    return _llama(tmp_path_factory.mktemp("valid") / "sharded", "10KB")


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _write_safetensors(path: Path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def pickled_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04never unpickled")


def pickle_beside(suffix: str):
    def breaks(folder: Path) -> None:
        (folder / f"extra{suffix}").write_bytes(b"\x80\x04never unpickled")

    return breaks


def python_file(folder: Path) -> None:
    (folder / "modeling_llama.py").write_text("raise SystemExit('this must never run')\n")


def symlink_out(folder: Path) -> None:
    outside = folder.parent / "elsewhere.safetensors"
    (folder / "model.safetensors").rename(outside)
    (folder / "model.safetensors").symlink_to(outside)


def symlink_loop(folder: Path) -> None:
    (folder / "a.json").symlink_to("b.json")
    (folder / "b.json").symlink_to("a.json")


def deep_config(folder: Path) -> None:
    (folder / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")


def auto_map(folder: Path) -> None:
    _edit_config(folder, auto_map={"AutoModel": "modeling_llama.LlamaModel"})


def nested_auto_map(folder: Path) -> None:
    _edit_config(folder, text_config={"model_type": "llama", "auto_map": {"AutoConfig": "configuration.Config"}})


def offsets_past_the_end(folder: Path) -> None:
    header = {
        "norm.weight": {"dtype": "F32", "shape": [32], "data_offsets": [0, 128]},
        "huge": {"dtype": "F32", "shape": [1 << 30], "data_offsets": [128, 128 + (4 << 30)]},
    }
    _write_safetensors(folder / "model.safetensors", header, bytes(128))


def header_longer_than_the_file(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")


def size_not_the_shape(folder: Path) -> None:
    header = {"norm.weight": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 128]}}
    _write_safetensors(folder / "model.safetensors", header, bytes(128))


def truncated(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) - 100])


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("model-*-of-*.safetensors"))


def missing_shard(folder: Path) -> None:
    _shards(folder)[1].unlink()


def shard_outside(folder: Path) -> None:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["norm.weight"] = f"../{_shards(folder)[0].name}"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def timm_backbone(folder: Path) -> None:
    _edit_config(
        folder,
        backbone_config={
            "model_type": "timm_backbone",
            "backbone": "resnet18",
            "model_args": {"checkpoint_path": "/tmp/a.pth"},
        },
    )


def unknown_model_type(folder: Path) -> None:
    _edit_config(folder, model_type="my_private_arch")


def config_of_other_weights(folder: Path) -> None:
    _edit_config(folder, hidden_size=48)


def no_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()


#: (the valid folder to start from, what breaks it, the file the message names, what the message says).
REFUSED = {
    "pytorch_model.bin": ("one_file", pickled_weights, "pytorch_model.bin", "safe_serialization=True"),
    ".pt beside": ("one_file", pickle_beside(".pt"), "extra.pt", "pickle"),
    ".pth beside": ("one_file", pickle_beside(".pth"), "extra.pth", "pickle"),
    ".ckpt beside": ("one_file", pickle_beside(".ckpt"), "extra.ckpt", "pickle"),
    ".py file": ("one_file", python_file, "modeling_llama.py", "never runs"),
    "symlink out": ("one_file", symlink_out, "model.safetensors", "cp -rL"),
    "symlink loop": ("one_file", symlink_loop, "a.json", "leads nowhere"),
    "config nested too deep": ("one_file", deep_config, "config.json", "nests deeper"),
    "auto_map": ("one_file", auto_map, "config.json", "trust_remote_code"),
    "auto_map in a sub-config": ("one_file", nested_auto_map, "config.json", "config.text_config.auto_map"),
    "offsets past the end": ("one_file", offsets_past_the_end, "model.safetensors", "past the file's end"),
    "header longer than the file": ("one_file", header_longer_than_the_file, "model.safetensors", "header"),
    "bytes not the shape's": ("one_file", size_not_the_shape, "model.safetensors", "needs 4000 bytes"),
    "truncated": ("one_file", truncated, "model.safetensors", "past the file's end"),
    "missing shard": ("sharded", missing_shard, "model-00002-of-", "copy the whole"),
    "shard outside the folder": ("sharded", shard_outside, "model.safetensors.index.json", "'../model-00001-of-"),
    "timm backbone": ("one_file", timm_backbone, "config.json", "config.backbone_config.model_type 'timm_backbone'"),
    "unknown model_type": ("one_file", unknown_model_type, "config.json", "my_private_arch"),
    "config of other weights": ("one_file", config_of_other_weights, "config.json", "does not describe these weights"),
    "no weights": ("one_file", no_weights, "model.safetensors", "safe_serialization=True"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_hostile_folder_is_refused_in_one_line_and_nothing_is_stored(case, request, tmp_path):
    start, breaks, names, says = REFUSED[case]
    folder = tmp_path / "checkpoint"
    shutil.copytree(request.getfixturevalue(start), folder)
    breaks(folder)

    inspected = invoke_cli("inspect", "checkpoint", cwd=tmp_path)
    registered = invoke_cli(
        "register",
        "m",
        "checkpoint",
        "--db",
        f"sqlite:///{tmp_path / 'r.db'}",
        "--blobs",
        str(tmp_path / "blobs"),
        cwd=tmp_path,
    )

    assert inspected.returncode == 6, inspected.stdout + inspected.stderr
    message = inspected.stderr.strip()
    assert "\n" not in message and message.startswith("error (bad_input_file): "), message
    assert names in message and says in message, message
    assert registered.returncode == 6, registered.stdout + registered.stderr
    assert registered.stderr.strip().count("\n") == 0, registered.stderr
    blobs = tmp_path / "blobs"
    assert not blobs.exists() or not any(path.is_file() for path in blobs.rglob("*")), "a refused folder stored blobs"
    print(f"{case}: {message}")  # the messages, read with -s


def test_a_sharded_folder_and_a_symlink_inside_it_are_read(sharded, tmp_path):
    from converters.models.loading import load_model

    folder = tmp_path / "checkpoint"
    shutil.copytree(sharded, folder)
    (folder / "weights").mkdir()
    shard = _shards(folder)[0].name
    (folder / shard).rename(folder / "weights" / shard)
    (folder / shard).symlink_to(Path("weights") / shard)

    assert [path for path, _ in load_model(folder, checkpoint_folders=True).named_modules() if path.endswith("norm")]


def test_a_folder_of_neither_kind_names_both(tmp_path):
    (tmp_path / "gpt2-hf").mkdir()
    (tmp_path / "gpt2-hf" / "README.md").write_text("weights elsewhere\n")

    done = invoke_cli("inspect", "gpt2-hf", cwd=tmp_path)

    assert done.returncode == 6
    assert "spec.json" in done.stderr and "config.json" in done.stderr and "save_pretrained" in done.stderr


def test_commands_that_run_a_model_refuse_a_folder_naming_what_works(one_file, tmp_path):
    from converters.models.loading import load_model

    with pytest.raises(InputFileError, match="take, but not this command yet"):
        load_model(one_file)


_PEAK = """
import sys
from converters.models.loading import load_model
from schemas import InputFileError
try:
    load_model(sys.argv[1], checkpoint_folders=True)
    print("loaded")
except InputFileError as error:
    print("refused:", error)
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def _peak(folder: Path) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    outcome, peak_kib = done.stdout.strip().splitlines()[-2:]
    return outcome, int(peak_kib) * 1024


def test_an_absurd_config_is_refused_without_allocating(one_file, tmp_path):
    absurd = tmp_path / "absurd"
    shutil.copytree(one_file, absurd)
    _edit_config(absurd, hidden_size=1_000_000_000)  # 4 GB per row of the embedding in float32

    outcome, peak = _peak(absurd)
    valid_outcome, valid_peak = _peak(one_file)

    assert outcome.startswith("refused:") and "hidden_size" not in outcome and "(64, 1000000000)" in outcome, outcome
    assert valid_outcome == "loaded"
    assert peak < valid_peak + 64 * 1024 * 1024, (peak, valid_peak)  # torch and transformers imported, nothing more


_WITHOUT_TRANSFORMERS = """
import sys
sys.modules["transformers"] = None
from cli.main import main
sys.argv = ["normbridge", "inspect", sys.argv[1]]
main()
"""


def test_inspect_without_transformers_is_one_line_naming_the_extra(one_file, tmp_path):
    from schemas.errors import EXIT_CODES, MissingDependencyError

    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TRANSFORMERS, str(one_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NORMBRIDGE_HOME": str(tmp_path / "home"), "COLUMNS": "200"},
    )

    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == EXIT_CODES[MissingDependencyError] and len(lines) == 1, done.stderr[-2000:]
    assert "normbridge[huggingface]" in lines[0] and "Traceback" not in done.stderr
