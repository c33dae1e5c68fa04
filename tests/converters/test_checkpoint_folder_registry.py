"""Registering a Hugging Face checkpoint folder: every tensor stored from its byte range, every normalization gated.

The tensors come back bit-identical to the files' (read here with safetensors itself), the specs are the ones `inspect`
lists, and a second version that changed only the running statistics stores only those tensors' blobs, which `diff`
names. Nothing comes from a hub (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import copy
import os
from hashlib import sha256
from pathlib import Path

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402

from converters.models.inspection import inspect_path  # noqa: E402
from registry.artifact import extract_artifact  # noqa: E402
from registry.blobs.local import LocalBlobStore  # noqa: E402
from registry.early_staging import EarlyStaging  # noqa: E402
from registry.service import Registry  # noqa: E402
from tests.cli_run import invoke_cli  # noqa: E402
from tests.converters.test_checkpoint_folder import _saved  # noqa: E402


def _registry(tmp_path: Path) -> Registry:
    return Registry(db=f"sqlite:///{tmp_path / 'registry.db'}", blobs=str(tmp_path / "blobs"), user="tester")


def _files_tensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's safetensors files as raw bytes, read by safetensors itself."""
    found = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as reader:
            for name in reader.keys():
                tensor = reader.get_tensor(name)
                found[name] = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return found


def _blob_files(tmp_path: Path) -> set[Path]:
    return {path for path in (tmp_path / "blobs").rglob("*") if path.is_file()}


@pytest.mark.parametrize("case", ["llama-bf16-one-file", "gemma2-bf16-sharded", "resnet-f32-one-file"])
def test_a_folder_registers_every_tensor_bit_identical_and_gates_every_norm(case, tmp_path):
    _saved(case, tmp_path / "checkpoint")
    registry = _registry(tmp_path)

    done = registry.register("tuned", tmp_path / "checkpoint")

    assert done.created and done.checks and all(check.passed for check in done.checks)
    assert done.version.servable, done.version.hazards
    listed = [layer.path for layer in inspect_path(tmp_path / "checkpoint").layers]
    assert sorted(spec.name for spec in registry.specs("tuned@1")) == sorted(listed)
    stored = registry.tensors("tuned@1")
    files = _files_tensors(tmp_path / "checkpoint")
    assert set(stored) == set(files)
    for name, array in stored.items():
        assert np.ascontiguousarray(array).view(np.uint8).tobytes() == files[name], name


def test_early_staging_stages_each_tensor_once_under_the_digest_the_extraction_gives(tmp_path):
    """registry/early_staging.py: every tensor's blob staged (hidden) while the model is read, under the digest the
    extraction computes from the files without it; nothing visible, and nothing left once closed."""
    _saved("gemma2-bf16-sharded", tmp_path / "checkpoint")
    reference = extract_artifact(tmp_path / "checkpoint").manifest.tensors
    store = LocalBlobStore(tmp_path / "blobs")

    early = EarlyStaging.start(tmp_path / "checkpoint", store)
    artifact = extract_artifact(tmp_path / "checkpoint", known=early.digest_of)

    assert {name: ref.digest for name, ref in artifact.manifest.tensors.items()} == {
        name: ref.digest for name, ref in reference.items()
    }
    taken = {digest: early.take(digest) for digest in {ref.digest for ref in reference.values()}}
    assert all(staged is not None for staged in taken.values()), "a tensor was not staged early"
    for digest, staged in taken.items():
        assert sha256(staged.temporary.read_bytes()).hexdigest() == digest
    assert list(store.digests()) == []  # staged, not stored
    early.close()
    for staged in taken.values():
        store.discard(staged)
    assert [path for path in (tmp_path / "blobs").rglob("*") if path.is_file()] == []


def test_early_staging_closed_while_it_writes_leaves_nothing(tmp_path):
    """What a registration refused while the folder is still being staged does (registration._register's finally)."""
    _saved("gemma2-bf16-sharded", tmp_path / "checkpoint")
    store = LocalBlobStore(tmp_path / "blobs")

    EarlyStaging.start(tmp_path / "checkpoint", store).close()

    assert [path for path in (tmp_path / "blobs").rglob("*") if path.is_file()] == []


def test_early_staging_hands_a_blob_the_store_held_back_to_the_leased_path(tmp_path):
    """A blob the store held when the thread looked was seen before the registration's lease (gc may remove it since):
    `take` gives None, so staging looks again under the lease; a registration after gc removed one still stores it."""
    _saved("llama-bf16-one-file", tmp_path / "checkpoint")
    registry = _registry(tmp_path)
    registry.register("tuned", tmp_path / "checkpoint")
    store = LocalBlobStore(tmp_path / "blobs")
    digests = set(store.digests())

    early = EarlyStaging.start(tmp_path / "checkpoint", store)
    artifact = extract_artifact(tmp_path / "checkpoint", known=early.digest_of)
    assert {ref.digest for ref in artifact.manifest.tensors.values()} <= digests
    assert [early.take(digest) for digest in digests] == [None] * len(digests)
    early.close()

    removed = sorted(digests)[0]
    store.path_of(removed).unlink()  # what gc does to an unreferenced blob between the thread's look and the lease
    registry.register("again", tmp_path / "checkpoint")
    assert set(store.digests()) == digests
    assert sha256(store.path_of(removed).read_bytes()).hexdigest() == removed


def test_a_registration_leaves_no_staging_file_and_the_digests_of_a_registration_without_early_staging(tmp_path):
    _saved("llama-bf16-one-file", tmp_path / "checkpoint")
    reference = extract_artifact(tmp_path / "checkpoint").manifest.tensors

    registry = _registry(tmp_path)
    registry.register("tuned", tmp_path / "checkpoint")

    manifest = registry.show("tuned@1").manifest
    assert {name: record["digest"] for name, record in manifest["tensors"].items()} == {
        name: ref.digest for name, ref in reference.items()
    }
    assert not [path for path in (tmp_path / "blobs").rglob(".*") if path.is_file()]


def test_a_statistics_only_version_stores_only_the_statistics_and_diff_says_so(tmp_path):
    model = _saved("resnet-f32-one-file", tmp_path / "v1")
    registry = _registry(tmp_path)
    registry.register("resnet", tmp_path / "v1")
    before = _blob_files(tmp_path)

    recalibrated = copy.deepcopy(model)
    norms = [path for path, module in recalibrated.named_modules() if isinstance(module, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for path in norms:
            module = recalibrated.get_submodule(path)
            module.running_mean.add_(0.25)
            module.running_var.mul_(1.5)
    recalibrated.save_pretrained(tmp_path / "v2")
    registry.register("resnet", tmp_path / "v2", parent="resnet@1")

    added = _blob_files(tmp_path) - before
    assert len(added) == 2 * len(norms)  # running_mean and running_var of each BatchNorm: nothing else
    diff = registry.diff("resnet@1", "resnet@2")
    assert diff.headline == f"weights identical, running statistics changed in {len(norms)} layers"
    assert diff.weights_identical and sorted(diff.statistics_changed_layers) == sorted(norms)
    assert {change.name for change in diff.tensors if change.status == "changed"} == {
        f"{path}.{stat}" for path in norms for stat in ("running_mean", "running_var")
    }


def test_register_and_show_commands_take_a_folder(tmp_path):
    _saved("llama-f32-sharded", tmp_path / "checkpoint")
    where = ["--db", f"sqlite:///{tmp_path / 'registry.db'}", "--blobs", str(tmp_path / "blobs")]

    registered = invoke_cli("register", "llama", "checkpoint", *where, cwd=tmp_path)
    shown = invoke_cli("show", "llama@1", *where, cwd=tmp_path)

    assert registered.returncode == 0, registered.stdout + registered.stderr
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "layers.1.post_attention_layernorm" in shown.stdout

    pulled = invoke_cli(
        "pull", "llama@1", "-o", "pulled/model.safetensors", "--format", "safetensors", *where, cwd=tmp_path
    )

    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert _files_tensors(tmp_path / "pulled") == _files_tensors(tmp_path / "checkpoint")
