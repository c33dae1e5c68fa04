"""What a model-scoped caller may not learn: the names of versions of models outside its scope (a parent, an ancestor).

Every place that shows a version's parent or lineage, in the API (versions, a version, a
registration, lineage, audit, bundle) and on the web pages, goes through one `Redactor` per
answer: a ref outside the caller's scope becomes a numbered placeholder, the same one for the
same version within that answer, so the shape (that a parent exists, which nodes share one)
is kept and its name is not. A caller with every model in scope gets everything as stored.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from registry.lineage import LineageView
from registry.entities import AuditRecord, VersionRecord, split_ref

from .auth import Principal

HIDDEN = "(model outside this token's scope)"


class Redactor:
    """The placeholders of one answer to `principal`."""

    def __init__(self, principal: Principal):
        self.principal = principal
        self._names: dict[str, str] = {}

    @property
    def hides_anything(self) -> bool:
        return self.principal.models is not None

    def ref(self, ref: str | None) -> str | None:
        """`ref` itself when the caller may see its model, else its placeholder."""
        if ref is None or not self.hides_anything or self.principal.may_see(split_ref(ref)[0]):
            return ref
        return self._names.setdefault(ref, f"{HIDDEN}#{len(self._names) + 1}")

    def is_hidden(self, ref: str | None) -> bool:
        """Whether `ref` is one of this answer's placeholders."""
        return ref is not None and ref in self._names.values()

    def manifest(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """A stored manifest (a dict) with its lineage parent redacted; a copy only when something changes."""
        lineage = manifest.get("lineage") or {}
        parent = lineage.get("parent")
        shown = self.ref(parent)
        if shown == parent:
            return manifest
        redacted = copy.copy(manifest)
        redacted["lineage"] = {**lineage, "parent": shown}
        return redacted

    def version(self, record: VersionRecord) -> VersionRecord:
        """A version with its parent redacted, in the record and in its manifest."""
        parent = self.ref(record.parent)
        if parent == record.parent:
            return record
        return dataclasses.replace(record, parent=parent, manifest=self.manifest(record.manifest))

    def lineage(self, view: LineageView) -> LineageView:
        """The view with versions outside the caller's scope anonymised and their notes dropped
        (the tree's shape is kept)."""
        if not self.hides_anything:
            return view
        nodes = [
            node.model_copy(
                update={
                    "ref": self.ref(node.ref),
                    "parent": self.ref(node.parent),
                    **({} if self.principal.may_see(split_ref(node.ref)[0]) else {"note": None}),
                }
            )
            for node in view.nodes
        ]
        return view.model_copy(
            update={
                "target": self.ref(view.target),
                "ancestors": [self.ref(r) for r in view.ancestors],
                "descendants": [self.ref(r) for r in view.descendants],
                "nodes": nodes,
            }
        )

    def audit(self, entry: AuditRecord) -> AuditRecord:
        """An audit entry whose detail names a parent (a registration) with that parent redacted."""
        parent = entry.detail.get("parent") if isinstance(entry.detail, dict) else None
        if not isinstance(parent, str) or self.ref(parent) == parent:
            return entry
        return dataclasses.replace(entry, detail={**entry.detail, "parent": self.ref(parent)})


__all__ = ["HIDDEN", "Redactor"]
