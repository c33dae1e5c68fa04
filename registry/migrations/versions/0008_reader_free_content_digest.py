"""Content digests that leave out the version of the framework that read the file (schemas/manifest.content_document).

Until this revision a version's content digest covered each normalizer's `spec.source.framework_version`, so the same
bytes registered again under another torch (Keras, ONNX) release made a new version "fine-tuned from" the first. This
revision recomputes every stored content digest from the stored manifest without it, so a registry made by an older
release keeps recognising identical bytes. The formula is written out here, not imported, so this step computes the
same digests whatever later releases change.

Where two versions of one model differ only by that provenance (the bug this fixes made such pairs), the earliest takes
the new digest and the later keeps its old one, which the unique (model, content) constraint requires; a registration
of the same bytes then answers with the earliest.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""

from __future__ import annotations

import hashlib
import json

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_CONTENT_FIELDS = ("framework", "format", "mode", "tensors", "normalizers", "structure")


def content_digest(manifest: dict, *, reader_free: bool = True) -> str:
    """The content digest of a stored manifest document: as schemas/manifest.content_document defines it at 0008, or
    (not `reader_free`) as it was before."""
    content = {name: manifest[name] for name in _CONTENT_FIELDS if name in manifest}
    if reader_free and "normalizers" in content:
        content["normalizers"] = [_without_reader(entry) for entry in content["normalizers"]]
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _without_reader(entry: dict) -> dict:
    source = entry.get("spec", {}).get("source")
    if not isinstance(source, dict) or "framework_version" not in source:
        return entry
    source = {key: value for key, value in source.items() if key != "framework_version"}
    return {**entry, "spec": {**entry["spec"], "source": source}}


def _recompute(reader_free: bool) -> None:
    versions = sa.table(
        "versions",
        sa.column("id", sa.Integer),
        sa.column("model_id", sa.Integer),
        sa.column("number", sa.Integer),
        sa.column("content_digest", sa.String),
        sa.column("manifest", sa.JSON),
    )
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(versions.c.id, versions.c.model_id, versions.c.content_digest, versions.c.manifest).order_by(
            versions.c.model_id, versions.c.number
        )
    ).all()
    taken = {(row.model_id, row.content_digest) for row in rows}
    for row in rows:
        manifest = json.loads(row.manifest) if isinstance(row.manifest, str) else row.manifest
        digest = content_digest(manifest, reader_free=reader_free)
        if digest == row.content_digest or (row.model_id, digest) in taken:
            continue
        taken.add((row.model_id, digest))
        connection.execute(versions.update().where(versions.c.id == row.id).values(content_digest=digest))


def upgrade() -> None:
    _recompute(reader_free=True)


def downgrade() -> None:
    _recompute(reader_free=False)
