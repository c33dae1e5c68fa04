"""A Hugging Face checkpoint folder over HTTP: `register --server` sends it as a bundle streamed from its files, leaving
out every blob the server already holds for the token (a recalibrated fine-tune sends its statistics, not its weights),
and `pull --server` writes the folder back byte-identical. Against a real `normbridge serve`; nothing from a hub."""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from registry.client import RemoteRegistry  # noqa: E402
from schemas.errors import RegistryError  # noqa: E402
from tests.cli_run import invoke_cli  # noqa: E402
from tests.http_server import create_token, running_server  # noqa: E402
from tests.registry.test_checkpoint_folder_pull import KEPT, _checkpoint, _files, _outputs  # noqa: E402

pytestmark = pytest.mark.slow  # starts a server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders-http")
    db, blobs = f"sqlite:///{root / 'registry.db'}", root / "blobs"
    with running_server(db=db, blobs=str(blobs), log=root / "serve.log") as running:
        yield {"url": running.url, "token": create_token(db, "alice", "write"), "blobs": blobs}


def _blob_files(blobs: Path) -> set[Path]:
    return {path for path in blobs.rglob("*") if path.is_file()}


def test_a_folder_goes_up_and_comes_back_and_a_recalibration_sends_only_its_statistics(server, tmp_path):
    model = _checkpoint("resnet-f32-one-file", tmp_path / "v1")
    sent: dict[str, int | None] = {}

    @contextmanager
    def transfer(description, total):
        sent[description] = total
        yield lambda done: None

    remote = RemoteRegistry(server["url"], server["token"], transfer=transfer)
    first = remote.register("resnet", tmp_path / "v1")
    assert first.created and first.checks and all(check.passed for check in first.checks)
    held = _blob_files(server["blobs"])

    recalibrated = copy.deepcopy(model)
    norms = [module for module in recalibrated.modules() if isinstance(module, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for module in norms:
            module.running_var.mul_(1.5)
    recalibrated.save_pretrained(tmp_path / "v2")
    for name, text in KEPT.items():
        (tmp_path / "v2" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "v2" / name).write_text(text)
    second = remote.register("resnet", tmp_path / "v2", parent="resnet@1")

    assert second.created and second.version.number == 2
    assert len(_blob_files(server["blobs"]) - held) == len(norms)  # each running_var: nothing else is new
    weights = os.path.getsize(tmp_path / "v2" / "model.safetensors")
    assert sent["uploading v2"] < sent["uploading v1"] - 0.9 * weights  # the weights went up once
    assert (
        remote.diff("resnet@1", "resnet@2").headline
        == f"weights identical, running statistics changed in {len(norms)} layers"
    )

    pulled = remote.pull("resnet@2", tmp_path / "back")
    assert pulled.path == str(tmp_path / "back") and pulled.format == "hf-folder"
    assert _files(tmp_path / "back") == _files(tmp_path / "v2")
    loaded = remote.load("resnet@1")
    pixels = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    assert torch.equal(
        _outputs(loaded, pixels), _outputs(transformers.ResNetModel.from_pretrained(tmp_path / "v1"), pixels)
    )
    with pytest.raises(RegistryError, match="folder, not one file"):
        remote.model_file("resnet@1")


def test_the_commands_take_a_folder_over_the_server(server, tmp_path):
    _checkpoint("llama-f32-sharded", tmp_path / "checkpoint")
    where = ["--server", server["url"], "--token", server["token"]]

    registered = invoke_cli(*where, "register", "llama", "checkpoint", cwd=tmp_path)
    pulled = invoke_cli(*where, "pull", "llama@1", "-o", "served/", cwd=tmp_path)

    assert registered.returncode == 0, registered.stdout + registered.stderr
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert _files(tmp_path / "served") == _files(tmp_path / "checkpoint")
