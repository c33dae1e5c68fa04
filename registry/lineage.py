"""The lineage of a version as a tree: its ancestors down to it, and every descendant below it.

Built from the records the metadata store returns (`lineage_edges`: ancestors nearest first, all
descendants); each edge carries the operation that made the child ('fine-tuned',
'recalibrated', ...). Records are read by attribute (model, number, parent, operation, note,
created_at), so any VersionRecord-like object works.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, Field


class LineageNode(BaseModel):
    """One version in the tree (flat: `parent` and `depth` place it; the list is in tree pre-order)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ref: str = Field(description="'name@N'.")
    parent: str | None = Field(default=None, description="Parent ref inside this view (None for the root).")
    depth: int = Field(ge=0, description="Distance from the root.")
    operation: str = Field(description="How this version was made from its parent.")
    note: str | None = None
    created_at: datetime | None = None
    target: bool = Field(default=False, description="The version the view was asked for.")


class LineageView(BaseModel):
    """Ancestors (root first) leading to the target, and the target's descendants as a tree.

    The tree is kept flat (pre-order list) so a 1,000-version chain needs no deep recursion.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str
    ancestors: list[str] = Field(default_factory=list, description="Refs from the root down to the target's parent.")
    descendants: list[str] = Field(default_factory=list, description="Refs of every descendant.")
    nodes: list[LineageNode] = Field(default_factory=list, description="Every version of the tree in pre-order.")

    @classmethod
    def from_records(cls, target: Any, ancestors: Iterable[Any], descendants: Iterable[Any]) -> "LineageView":
        """The view of `target` given its ancestors (nearest first) and all its descendants."""
        return build_lineage(target, ancestors, descendants)

    def children(self, ref: str | None) -> list[LineageNode]:
        return [node for node in self.nodes if node.parent == ref]

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=indent)

    def render_text(self) -> str:
        """An ASCII tree; the target is marked with '*'."""
        return "\n".join(prefix + _label(node) for prefix, node in self._rows())

    def _rows(self) -> list[tuple[str, LineageNode]]:
        """(prefix, node) per line, computed without recursion."""
        last_child: dict[str | None, str] = {}
        for node in self.nodes:
            last_child[node.parent] = node.ref
        rows: list[tuple[str, LineageNode]] = []
        open_levels: list[bool] = []  # per depth: does the ancestor at that depth have later siblings
        for node in self.nodes:
            if node.depth == 0:
                rows.append(("", node))
                open_levels = []
                continue
            is_last = last_child.get(node.parent) == node.ref
            del open_levels[node.depth - 1 :]
            prefix = "".join("│   " if more else "    " for more in open_levels)
            rows.append((prefix + ("└── " if is_last else "├── "), node))
            open_levels.append(not is_last)
        return rows

    def to_rich(self):
        """The same tree as a rich.tree.Tree."""
        from rich.tree import Tree

        trees: dict[str, Any] = {}
        root = None
        for node in self.nodes:
            if node.parent is None or node.parent not in trees:
                root = Tree(_label(node, rich=True))
                trees[node.ref] = root
            else:
                trees[node.ref] = trees[node.parent].add(_label(node, rich=True))
        return root

    def __rich__(self):
        return self.to_rich()


def _label(node: LineageNode, rich: bool = False) -> str:
    ref = f"[bold]{node.ref}[/bold]" if rich and node.target else node.ref
    text = f"{ref} ({node.operation})"
    if node.note:
        text += f" - {node.note}"
    if node.target:
        text += "  [cyan]<- this version[/cyan]" if rich else "  *"
    return text


def _ref(record: Any) -> str:
    ref = getattr(record, "ref", None)
    return ref if isinstance(ref, str) else f"{record.model}@{record.number}"


def _node(record: Any, parent: str | None, depth: int, target: bool) -> LineageNode:
    return LineageNode(
        ref=_ref(record),
        parent=parent,
        depth=depth,
        operation=record.operation,
        note=getattr(record, "note", None),
        created_at=getattr(record, "created_at", None),
        target=target,
    )


def build_lineage(target: Any, ancestors: Iterable[Any], descendants: Iterable[Any]) -> LineageView:
    """A LineageView from the target record, its ancestors (nearest first) and its descendants (any order)."""
    chain = list(reversed(list(ancestors))) + [target]  # root first
    descendants = list(descendants)
    by_parent: dict[str, list[Any]] = {}
    for record in descendants:
        by_parent.setdefault(record.parent, []).append(record)
    nodes: list[LineageNode] = []
    parent = None
    for depth, record in enumerate(chain):
        nodes.append(_node(record, parent, depth, record is target))
        parent = _ref(record)
    seen = {_ref(record) for record in chain}
    stack = [(child, len(chain)) for child in sorted(by_parent.get(parent, []), key=_order, reverse=True)]
    while stack:  # depth-first pre-order, children in version order
        record, depth = stack.pop()
        ref = _ref(record)
        if ref in seen:
            continue
        seen.add(ref)
        nodes.append(_node(record, record.parent, depth, False))
        stack.extend((child, depth + 1) for child in sorted(by_parent.get(ref, []), key=_order, reverse=True))
    return LineageView(
        target=_ref(target),
        ancestors=[_ref(r) for r in chain[:-1]],
        descendants=[_ref(r) for r in sorted(descendants, key=_order)],
        nodes=nodes,
    )


def _order(record: Any) -> tuple[str, int]:
    return (record.model, record.number)
