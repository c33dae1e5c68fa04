"""The manifest's record of unrecognised layers: present only when there are some, so older digests hold."""

from __future__ import annotations

import json

from schemas.manifest import ArtifactManifest, UnrecognisedLayer, load_manifest

EMPTY = {"framework": "torch", "format": "pt2", "mode": "eval", "tensors": {}, "normalizers": []}


def test_a_manifest_without_unrecognised_layers_serialises_as_before_the_field_existed():
    document = json.loads(ArtifactManifest(**EMPTY).to_canonical_json())
    assert "unrecognised" not in document
    expected = {
        "equivalence": [],
        "format": "pt2",
        "framework": "torch",
        "lineage": {"operation": "registered", "parent": None},
        "mode": "eval",
        "normalizers": [],
        "note": None,
        "schema_version": 1,
        "tensors": {},
    }
    assert document == expected


def test_unrecognised_layers_round_trip_and_change_the_digest_but_not_the_content_digest():
    plain = ArtifactManifest(**EMPTY)
    held = ArtifactManifest(
        **EMPTY, unrecognised=[UnrecognisedLayer(path="model.norm", type="MyNorm", reason="class name contains 'Norm'")]
    )
    back = load_manifest(json.loads(held.to_json()))
    assert back.unrecognised == held.unrecognised
    assert back.digest() == held.digest() != plain.digest()
    assert held.content_digest() == plain.content_digest()


def test_one_dump_gives_the_digests_and_document_each_method_gives():
    """digests_and_document() against digest(), content_digest() and model_dump() called apart (a registered model's
    manifest, with structure and equivalence report: tests/registry/test_pull.py)."""
    for manifest in (
        ArtifactManifest(**EMPTY),
        ArtifactManifest(
            **EMPTY,
            note="fine-tuned",
            unrecognised=[UnrecognisedLayer(path="model.norm", type="MyNorm", reason="class name contains 'Norm'")],
        ),
    ):
        assert manifest.digests_and_document() == (
            manifest.digest(),
            manifest.content_digest(),
            manifest.model_dump(mode="json"),
        )
