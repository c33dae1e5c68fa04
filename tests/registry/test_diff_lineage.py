"""Diffs on a chain built by real torch training steps, config changes, and the lineage tree."""

from __future__ import annotations

import copy
from datetime import datetime, timezone

import numpy as np
import pytest
import torch

from registry.artifact import extract_artifact
from registry.manifest_io import tensors_from_blobs
from registry.diff import diff_manifests
from registry.lineage import LineageView, build_lineage
from registry.entities import VersionRecord
from schemas.manifest import STATISTIC_ROLES


class ChainCNN(torch.nn.Module):
    """Two Conv+BatchNorm blocks and a LayerNorm head."""

    def __init__(self):
        super().__init__()
        self.block1 = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.BatchNorm2d(6), torch.nn.ReLU())
        self.block2 = torch.nn.Sequential(torch.nn.Conv2d(6, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
        self.norm = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.norm(self.block2(self.block1(x)).mean(dim=(2, 3))))


def _batch(generator: torch.Generator, shift: float = 0.0):
    x = torch.randn(8, 3, 6, 6, generator=generator) + shift
    y = torch.randint(0, 3, (8,), generator=generator)
    return x, y


def _train(model, optimizer, generator, steps: int, shift: float = 0.0) -> None:
    model.train()
    for _ in range(steps):
        x, y = _batch(generator, shift)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    model.eval()


@pytest.fixture(scope="module")
def chain():
    """v1 trained, v2 a stats-only fine-tune of v1 (weights frozen), v3 a normal fine-tune of v2."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = ChainCNN()
    _train(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), generator, steps=4)
    v1 = extract_artifact(model)

    for parameter in model.parameters():
        parameter.requires_grad_(False)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(_batch(generator, shift=0.5)[0])
    model.eval()
    v2 = extract_artifact(model)

    for parameter in model.parameters():
        parameter.requires_grad_(True)
    _train(model, torch.optim.SGD(model.parameters(), lr=0.05), generator, steps=1, shift=0.5)
    v3 = extract_artifact(model)
    blobs = {**v1.blobs, **v2.blobs, **v3.blobs}
    return v1, v2, v3, blobs.__getitem__


def test_stats_only_fine_tune_reads_weights_identical(chain):
    v1, v2, _, get = chain
    diff = diff_manifests(v1.manifest, v2.manifest, get, "cnn@1", "cnn@2")
    assert diff.headline == "weights identical, running statistics changed in 2 layers"
    assert diff.weights_identical and not diff.identical
    assert diff.statistics_changed_layers == ["block1.1", "block2.1"]
    for tensor in diff.tensors:
        if tensor.role in STATISTIC_ROLES:
            assert tensor.status == "changed", tensor.name
        else:
            assert tensor.status == "unchanged", tensor.name
    # the reported changes agree with NumPy on the tensors themselves
    a, b = tensors_from_blobs(v1.manifest, get), tensors_from_blobs(v2.manifest, get)
    change = next(t for t in diff.tensors if t.name == "block1.1.running_mean")
    delta = np.abs(b["block1.1.running_mean"].astype(np.float64) - a["block1.1.running_mean"])
    assert change.max_abs_change == pytest.approx(float(delta.max()), rel=0, abs=0)
    assert change.max_rel_change == pytest.approx(float((delta / np.abs(a["block1.1.running_mean"])).max()))
    text = diff.render_text()
    assert "cnn@1 -> cnn@2: weights identical, running statistics changed in 2 layers" in text
    assert "block2.1.running_var" in text and "block1.0.weight" not in text  # unchanged tensors are summarised
    assert "block1.0.weight" in diff.render_text(show_unchanged=True)
    assert type(diff).model_validate_json(diff.to_json()) == diff


def test_normal_fine_tune_reads_weights_changed(chain):
    _, v2, v3, get = chain
    diff = diff_manifests(v2.manifest, v3.manifest, get)
    assert not diff.weights_identical
    assert diff.headline.startswith("weights changed in ") and "running statistics changed in 2 layers" in diff.headline
    changed = {t.name for t in diff.tensors if t.status == "changed"}
    assert {"block1.0.weight", "fc.weight", "norm.weight"} <= changed
    assert diff_manifests(v3.manifest, v3.manifest, get).headline == "identical content"


def test_stats_only_version_shares_every_weight_blob(chain):
    v1, v2, _, _ = chain
    new_digests = set(v2.blobs) - set(v1.blobs)
    stat_refs = [ref for ref in v2.manifest.tensors.values() if ref.role in STATISTIC_ROLES]
    assert new_digests == {ref.digest for ref in stat_refs}
    for name, ref in v2.manifest.tensors.items():
        if ref.role not in STATISTIC_ROLES:
            assert ref.digest == v1.manifest.tensors[name].digest, name
    new_bytes = sum(len(v2.blobs[d]) for d in new_digests)
    total = sum(len(data) for data in v2.blobs.values())
    # equal statistics share a blob too (both layers' num_batches_tracked are 7)
    assert new_bytes == sum(len(v2.blobs[d]) for d in {ref.digest for ref in stat_refs}) and new_bytes < total / 4
    assert (
        v2.manifest.tensors["block1.1.num_batches_tracked"].digest
        == v2.manifest.tensors["block2.1.num_batches_tracked"].digest
    )


def test_changed_eps_is_a_config_change_with_equal_tensors(chain):
    v1, _, _, _ = chain
    get = v1.blobs.__getitem__
    model = ChainCNN()
    model.load_state_dict(_state(v1))
    model.eval()
    before = extract_artifact(model).manifest
    assert before.content_digest() == v1.manifest.content_digest()
    changed_model = copy.deepcopy(model)
    changed_model.block2[1].eps = 1e-3
    after = extract_artifact(changed_model)
    diff = diff_manifests(before, after.manifest, {**v1.blobs, **after.blobs}.__getitem__)
    assert all(t.status == "unchanged" for t in diff.tensors)
    assert diff.config_changed_layers == ["block2.1"]
    (entry,) = [n for n in diff.normalizers if n.status == "changed"]
    assert [(c.field, c.before, c.after) for c in entry.config_changes] == [("eps", 1e-5, 1e-3)]
    assert diff.headline == "weights identical, running statistics identical, config changed in 1 normalizer"
    assert "config eps: 1e-05 -> 0.001" in diff.render_text()
    del get


def _state(artifact) -> dict:
    arrays = tensors_from_blobs(artifact.manifest, artifact.blobs.__getitem__)
    return {name: torch.from_numpy(np.array(array)) for name, array in arrays.items()}


# -- lineage --------------------------------------------------------------------------------


def _record(
    number: int, parent: int | None, operation: str, model: str = "cnn", note: str | None = None
) -> VersionRecord:
    return VersionRecord(
        model=model,
        number=number,
        digest="0" * 64,
        content_digest=f"{number:064d}",
        manifest={},
        parent=None if parent is None else f"cnn@{parent}",
        operation=operation,
        note=note,
        created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
        user="tester",
    )


def test_lineage_renders_a_chain_and_a_branch_with_operations():
    r = {
        1: _record(1, None, "registered"),
        2: _record(2, 1, "fine-tuned"),
        3: _record(3, 2, "recalibrated", note="new camera"),
        4: _record(4, 2, "fine-tuned"),
        5: _record(5, 4, "converted"),
    }
    view = LineageView.from_records(r[2], [r[1]], [r[5], r[3], r[4]])
    assert view.ancestors == ["cnn@1"] and view.descendants == ["cnn@3", "cnn@4", "cnn@5"]
    assert view.render_text() == "\n".join(
        [
            "cnn@1 (registered)",
            "└── cnn@2 (fine-tuned)  *",
            "    ├── cnn@3 (recalibrated) - new camera",
            "    └── cnn@4 (fine-tuned)",
            "        └── cnn@5 (converted)",
        ]
    )
    leaf = build_lineage(r[5], [r[4], r[2], r[1]], [])
    assert leaf.ancestors == ["cnn@1", "cnn@2", "cnn@4"]
    assert leaf.render_text().splitlines()[-1] == "        └── cnn@5 (converted)  *"
    from rich.console import Console

    console = Console(width=80, record=True, color_system=None)
    console.print(view)
    printed = console.export_text()
    assert "cnn@3 (recalibrated)" in printed and "cnn@2 (fine-tuned)  <- this version" in printed
    assert LineageView.model_validate_json(view.to_json()) == view


def test_lineage_of_a_long_chain_needs_no_recursion():
    records = [_record(1, None, "registered")] + [_record(n, n - 1, "fine-tuned") for n in range(2, 1501)]
    view = build_lineage(records[0], [], records[1:])
    assert len(view.nodes) == 1500 and view.nodes[-1].depth == 1499
    lines = view.render_text().splitlines()
    assert len(lines) == 1500 and lines[-1].endswith("└── cnn@1500 (fine-tuned)")
