"""Registration never passes what it cannot check: unrecognised normalizations and models with no normalization at all.

A model holding a layer that looks like a normalization and that no recognizer proves (here an RMSNorm with
eps outside the square root) is refused with exit 21 / HTTP 422 and leaves the registry unchanged; with
--allow-unrecognised it registers, and the manifest and the audit log name the unchecked layer.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from schemas.errors import UnrecognisedNormalizationError
from tests.cli_run import invoke_cli, run_cli
from tests.http_server import running_server
from tests.real_norms import EpsOutsideNorm


class Block(torch.nn.Module):
    """A Linear, a stock LayerNorm (recognised and checked) and a near miss
    (looks like a norm, computes something else)."""

    def __init__(self):
        super().__init__()
        self.proj, self.norm, self.odd = torch.nn.Linear(6, 6), torch.nn.LayerNorm(6), EpsOutsideNorm(6)

    def forward(self, x):
        return self.odd(self.norm(self.proj(x)))


def block() -> Block:
    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter))
    return model


def save_pt2(model: torch.nn.Module, path: Path) -> Path:
    torch.export.save(torch.export.export(model, (torch.randn(2, 6),)), str(path))
    return path


@pytest.fixture
def registry(tmp_path):
    from registry.service import Registry

    return Registry(db=f"sqlite:///{tmp_path / 'registry.db'}", blobs=str(tmp_path / "blobs"), user="tester")


@pytest.mark.parametrize("as_file", [False, True], ids=["module", "pt2"])
def test_an_unrecognised_normalization_is_refused_naming_it_and_nothing_is_stored(registry, tmp_path, as_file):
    model = save_pt2(block(), tmp_path / "block.pt2") if as_file else block()
    with pytest.raises(UnrecognisedNormalizationError) as info:
        registry.register("block", model)
    assert info.value.layer == "odd" and "--allow-unrecognised" in str(info.value)
    assert registry.models() == [] and sorted(registry.store.digests()) == []
    assert [a.action for a in registry.audit()] == ["register_failed"]
    assert registry.audit()[0].detail["error"] == "unrecognised_normalization"


@pytest.mark.parametrize("as_file", [False, True], ids=["module", "pt2"])
def test_allowed_it_registers_with_the_unchecked_layer_in_the_manifest_and_the_audit_log(registry, tmp_path, as_file):
    model = save_pt2(block(), tmp_path / "block.pt2") if as_file else block()
    result = registry.register("block", model, allow_unrecognised=True)
    assert [u.path for u in result.unrecognised] == ["odd"]
    assert [c.passed for c in result.checks] == [True]  # the stock LayerNorm is still checked
    manifest = registry.manifest("block@1")
    assert [u.path for u in manifest.unrecognised] == ["odd"] and "EpsOutsideNorm" in manifest.unrecognised[0].type
    assert [n.path for n in manifest.normalizers] == ["norm"]
    entry = registry.audit()[-1]
    assert entry.action == "register" and entry.detail["allowed_unrecognised"] == ["odd"]


def test_a_model_with_weights_and_no_normalization_is_not_a_pass(registry):
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
    with pytest.raises(UnrecognisedNormalizationError) as info:
        registry.register("mlp", mlp)
    assert "no normalization layer was found" in str(info.value) and registry.models() == []
    result = registry.register("mlp", mlp, allow_unrecognised=True)
    assert result.checks == [] and [u.path for u in result.unrecognised] == ["<model>"]


def test_an_onnx_graph_whose_batchnorm_the_exporter_folded_is_refused_saying_so(registry, tmp_path):
    import warnings

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, (torch.randn(1, 3, 8, 8),), str(tmp_path / "folded.onnx"), dynamo=False
        )  # its default folds Conv+BN
    with pytest.raises(UnrecognisedNormalizationError) as info:
        registry.register("folded", tmp_path / "folded.onnx")
    message = str(info.value)
    assert (
        "no normalization layer was found" in message
        and "folded into the Conv weights" in message
        and "optimize=False" in message
        and "do_constant_folding=False" in message
    )
    assert registry.models() == []
    result = registry.register("folded", tmp_path / "folded.onnx", allow_unrecognised=True)
    [entry] = result.unrecognised
    assert entry.path == "<model>" and "folded into the Conv weights" in entry.reason
    record = registry.show("folded@1")
    assert record.servable is False and [h["code"] for h in record.hazards if h.get("blocking")] == [
        "no_normalization_found"
    ]
    # a model with no normalization and nothing that explains it keeps the plain refusal
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
    with pytest.raises(UnrecognisedNormalizationError) as plain:
        registry.register("mlp", mlp)
    assert "folded" not in str(plain.value)


def test_a_fully_recognised_model_has_no_unrecognised_entry_and_keeps_its_manifest_shape(registry):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).eval()
    result = registry.register("bn", model)
    assert result.unrecognised == []
    assert "unrecognised" not in registry.manifest("bn@1").model_dump(mode="json")


@pytest.mark.slow
def test_the_cli_exits_21_then_registers_with_the_flag_and_says_what_is_unchecked(tmp_path):
    save_pt2(block(), tmp_path / "block.pt2")
    store = ["--db", f"sqlite:///{tmp_path / 'r.db'}", "--blobs", str(tmp_path / "blobs")]
    refused = run_cli("register", "block", "block.pt2", *store, cwd=tmp_path)
    assert refused.returncode == 21, refused.stderr
    assert "'odd'" in refused.stderr and "--allow-unrecognised" in refused.stderr and "Traceback" not in refused.stderr
    done = invoke_cli(
        "register", "block", "block.pt2", "--allow-unrecognised", *store, cwd=tmp_path, columns=200
    )  # in this process
    assert done.returncode == 0, done.stderr
    assert "unchecked" in done.stdout and "odd" in done.stdout
    from registry.service import Registry

    registry = Registry(db=f"sqlite:///{tmp_path / 'r.db'}", blobs=str(tmp_path / "blobs"))
    assert [u.path for u in registry.manifest("block@1").unrecognised] == ["odd"]
    assert [a.action for a in registry.audit()] == ["register_failed", "register"]


@pytest.mark.slow
def test_the_server_answers_422_and_registers_only_when_allowed_and_its_page_says_unchecked(tmp_path):
    db, blobs = f"sqlite:///{tmp_path / 'registry.db'}", str(tmp_path / "blobs")
    body = save_pt2(block(), tmp_path / "block.pt2").read_bytes()
    with (
        running_server(db=db, blobs=blobs, args=["--insecure-local"], log=tmp_path / "serve.log") as server,
        httpx.Client(base_url=server.url, timeout=300) as client,
    ):
        refused = client.post(
            "/api/v1/models/block/versions",
            params={"format": "pt2"},
            content=body,
            headers={"Content-Type": "application/octet-stream"},
        )
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "unrecognised_normalization", (
            refused.text
        )
        assert client.get("/api/v1/models/block/versions").status_code == 404  # nothing was registered
        allowed = client.post(
            "/api/v1/models/block/versions",
            params={"format": "pt2", "allow_unrecognised": "true"},
            content=body,
            headers={"Content-Type": "application/octet-stream"},
        )
        assert allowed.status_code == 201, allowed.text
        assert [u["path"] for u in allowed.json()["unrecognised"]] == ["odd"]
        page = client.get("/ui/models/block/versions/1")
        assert page.status_code == 200
        assert (
            "equivalence incomplete" in page.text
            and 'data-unchecked="odd"' in page.text
            and "equivalence passed" not in page.text
        )
