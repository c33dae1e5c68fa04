"""`diff`'s headline is derived from its rows (issue 16 item 8).

Across formats (a torch model against its own ONNX export) and between unrelated models, the
headline said "running statistics identical" while the rows said the statistics tensors were
removed, and the web page showed every added or removed layer's weights as "identical". Now every
part of the headline counts rows, and an added or removed normalizer has no weights or statistics
verdict (None), shown as added or removed.
"""

from __future__ import annotations

import re

import pytest
import torch

from registry.artifact import extract_artifact
from registry.diff import diff_manifests
from registry.web.router import templates
from schemas.manifest import STATISTIC_ROLES, WEIGHT_ROLES
from schemas.manifest_diff import ManifestDiff


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(6)
        self.fc = torch.nn.Linear(6, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(self.proj(x))


def _trained(model: torch.nn.Module, shape: tuple[int, ...]) -> torch.nn.Module:
    torch.manual_seed(0)
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(*shape) * 2 + 1)
    return model.eval()


@pytest.fixture(scope="module")
def artifacts():
    torch.manual_seed(0)
    conv = _trained(ConvNet(), (4, 3, 8, 8))
    exported = torch.onnx.export(
        conv, (torch.randn(2, 3, 8, 8),), dynamo=True, optimize=False, verbose=False
    ).model_proto
    found = {
        "torch": extract_artifact(conv),
        "onnx": extract_artifact(exported),
        "block": extract_artifact(Block().eval()),
    }
    blobs = {digest: data for artifact in found.values() for digest, data in artifact.blobs.items()}
    return found, blobs.__getitem__


def _counts(diff: ManifestDiff, roles) -> dict[str, int]:
    rows = [t for t in diff.tensors if t.role in roles]
    return {status: sum(t.status == status for t in rows) for status in ("unchanged", "changed", "added", "removed")}


def assert_headline_agrees_with_rows(diff: ManifestDiff) -> None:
    headline = diff.headline
    weights, statistics = _counts(diff, WEIGHT_ROLES), _counts(diff, STATISTIC_ROLES)
    if "weights identical" in headline:
        assert weights["changed"] == weights["added"] == weights["removed"] == 0
    if "running statistics identical" in headline:
        assert statistics["changed"] == statistics["added"] == statistics["removed"] == 0
        assert not any(n.statistics_changed for n in diff.normalizers)
    for word, counts in (("weight tensor", weights), ("running-statistics tensor", statistics)):
        for status in ("added", "removed"):
            said = re.search(rf"(\d+) {word}s? {status}", headline)
            assert (int(said.group(1)) if said else 0) == counts[status], (headline, word, status, counts)
    for status in ("added", "removed"):
        said = re.search(rf"(\d+) normalizers? {status}", headline)
        assert (int(said.group(1)) if said else 0) == sum(n.status == status for n in diff.normalizers), headline


@pytest.mark.slow
def test_across_formats_the_headline_never_calls_removed_statistics_identical(artifacts):
    found, get = artifacts
    diff = diff_manifests(found["torch"].manifest, found["onnx"].manifest, get, "m@1", "m@2")
    assert_headline_agrees_with_rows(diff)
    assert "framework torch -> onnx" in diff.headline
    removed_counts = [t for t in diff.tensors if t.role == "num_batches_tracked" and t.status == "removed"]
    assert removed_counts and "running statistics identical" not in diff.headline  # ONNX has no num_batches_tracked


@pytest.mark.slow
def test_unrelated_models_say_added_and_removed_not_identical(artifacts):
    found, get = artifacts
    diff = diff_manifests(found["torch"].manifest, found["block"].manifest, get, "m@1", "m@3")
    assert_headline_agrees_with_rows(diff)
    assert "identical" not in diff.headline
    assert "1 normalizer added" in diff.headline and "1 normalizer removed" in diff.headline
    moved = [n for n in diff.normalizers if n.status in ("added", "removed")]
    assert len(moved) == 2 and all(n.weights_changed is None and n.statistics_changed is None for n in moved)

    page = templates.get_template("diff.html").render(diff=diff, plot="", a_url="#", b_url="#")
    rows = re.findall(
        r'<tr data-layer="([^"]+)"><td class="mono">[^<]*</td><td>(\w+)</td>\s*<td>(\w+)</td><td>(\w+)</td>', page
    )
    assert sorted(rows) == sorted((n.path, n.status, n.status, n.status) for n in moved)
    assert "identical" not in "".join(cell for row in rows for cell in row[1:])


@pytest.mark.slow
def test_same_model_twice_is_identical_and_common_layers_keep_their_verdicts(artifacts):
    found, get = artifacts
    same = diff_manifests(found["torch"].manifest, found["torch"].manifest, get)
    assert same.headline == "identical content"
    assert all(n.weights_changed is False and n.statistics_changed is False for n in same.normalizers)
