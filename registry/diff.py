"""Comparing two artifact manifests: which tensors moved, by how much, and which settings changed.

Tensors are compared by name; equal digests mean equal bytes, so only changed tensors are read.
The headline names the case a user asks about first: did the weights move, or only the running
statistics (a stats-only fine-tune or a recalibration), or a setting such as eps.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from schemas.manifest import STATISTIC_ROLES, WEIGHT_ROLES, ArtifactManifest
from schemas.manifest_diff import ConfigChange, ManifestDiff, NormalizerChange, TensorChange

from .tensor_blobs import tensor_from_blob

#: Denominator floor of the relative change (a tensor entry of 0 that moves is reported relative to this).
REL_FLOOR = 1e-12


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _tensor_change(name: str, a: ArtifactManifest, b: ArtifactManifest, get: Callable[[str], bytes]) -> TensorChange:
    ref_a, ref_b = a.tensors.get(name), b.tensors.get(name)
    if ref_a is None:
        return TensorChange(name=name, role=ref_b.role, layer=ref_b.layer, status="added")
    if ref_b is None:
        return TensorChange(name=name, role=ref_a.role, layer=ref_a.layer, status="removed")
    if ref_a.digest == ref_b.digest:
        return TensorChange(name=name, role=ref_b.role, layer=ref_b.layer, status="unchanged")
    if ref_a.shape != ref_b.shape or ref_a.dtype != ref_b.dtype:
        detail = f"{ref_a.dtype}{ref_a.shape} -> {ref_b.dtype}{ref_b.shape}"
        return TensorChange(name=name, role=ref_b.role, layer=ref_b.layer, status="changed", detail=detail)
    left = tensor_from_blob(get(ref_a.digest), ref_a, name).astype(np.float64)
    right = tensor_from_blob(get(ref_b.digest), ref_b, name).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        delta = np.abs(right - left)
        relative = delta / np.maximum(np.abs(left), REL_FLOOR)
    return TensorChange(
        name=name,
        role=ref_b.role,
        layer=ref_b.layer,
        status="changed",
        max_abs_change=float(np.max(delta)) if delta.size else 0.0,
        max_rel_change=float(np.max(relative)) if relative.size else 0.0,
    )


def _config_changes(before: dict, after: dict) -> list[ConfigChange]:
    changes = []
    for key in sorted(set(before) | set(after)):
        if key == "name":
            continue  # the path is the identity, compared by matching entries
        if before.get(key) != after.get(key):
            changes.append(ConfigChange(field=key, before=before.get(key), after=after.get(key)))
    return changes


def diff_manifests(
    a: ArtifactManifest,
    b: ArtifactManifest,
    get: Callable[[str], bytes],
    label_a: str | None = None,
    label_b: str | None = None,
) -> ManifestDiff:
    """What changed from `a` to `b`; `get(digest)` supplies blob bytes (only changed tensors are read)."""
    tensors = [_tensor_change(name, a, b, get) for name in sorted(set(a.tensors) | set(b.tensors))]
    by_name = {t.name: t for t in tensors}

    entries_a = {entry.path: entry for entry in a.normalizers}
    entries_b = {entry.path: entry for entry in b.normalizers}
    normalizers: list[NormalizerChange] = []
    stats_layers: list[str] = []
    config_layers: list[str] = []
    for path in list(entries_a) + [p for p in entries_b if p not in entries_a]:
        if path not in entries_b:  # nothing to compare: weights and statistics are neither identical nor changed (None)
            normalizers.append(
                NormalizerChange(path=path, status="removed", statistics_changed=None, weights_changed=None)
            )
            continue
        if path not in entries_a:
            normalizers.append(
                NormalizerChange(path=path, status="added", statistics_changed=None, weights_changed=None)
            )
            continue
        entry_a, entry_b = entries_a[path], entries_b[path]
        config = _config_changes(entry_a.spec, entry_b.spec)
        moved_stats = moved_weights = False
        for spec_name in set(entry_a.tensors) | set(entry_b.tensors):
            name_a, name_b = entry_a.tensors.get(spec_name), entry_b.tensors.get(spec_name)
            if name_a is None or name_b is None:
                moved = True
            elif name_a == name_b:
                moved = by_name[name_b].status != "unchanged"
            else:
                moved = a.tensors[name_a].digest != b.tensors[name_b].digest
            if moved and spec_name in STATISTIC_ROLES:
                moved_stats = True
            elif moved:
                moved_weights = True
        if moved_stats:
            stats_layers.append(path)
        if config:
            config_layers.append(path)
        status = "changed" if (config or moved_stats or moved_weights) else "unchanged"
        normalizers.append(
            NormalizerChange(
                path=path,
                status=status,
                config_changes=config,
                statistics_changed=moved_stats,
                weights_changed=moved_weights,
            )
        )

    top_level = [
        ConfigChange(field=field, before=getattr(a, field), after=getattr(b, field))
        for field in ("framework", "format", "mode")
        if getattr(a, field) != getattr(b, field)
    ]
    moved_weight_tensors = [t for t in tensors if t.role in WEIGHT_ROLES and t.status != "unchanged"]
    identical = a.content_digest() == b.content_digest()
    headline = _headline(identical, moved_weight_tensors, stats_layers, config_layers, normalizers, tensors, top_level)
    return ManifestDiff(
        a=label_a or a.content_digest()[:12],
        b=label_b or b.content_digest()[:12],
        headline=headline,
        identical=identical,
        weights_identical=not moved_weight_tensors,
        statistics_changed_layers=stats_layers,
        config_changed_layers=config_layers,
        tensors=tensors,
        normalizers=normalizers,
        top_level=top_level,
    )


def _headline(identical, moved_weights, stats_layers, config_layers, normalizers, tensors, top_level) -> str:
    """The headline, derived from the rows: every part counts tensor or normalizer rows,
    so it cannot contradict them."""
    if identical:
        return "identical content"
    parts = []
    if top_level:
        parts.append(", ".join(f"{c.field} {c.before} -> {c.after}" for c in top_level))
    weights = [t for t in tensors if t.role in WEIGHT_ROLES]
    changed_weights = [t for t in moved_weights if t.status == "changed"]
    if changed_weights:
        layers = {t.layer or t.name for t in changed_weights}
        parts.append(f"weights changed in {_plural(len(changed_weights), 'tensor')} ({_plural(len(layers), 'layer')})")
    elif not moved_weights and weights:
        parts.append("weights identical")
    parts += _appeared(weights, "weight tensor")
    statistics = [t for t in tensors if t.role in STATISTIC_ROLES]
    moved_stat_layers = set(stats_layers) | {t.layer or t.name for t in statistics if t.status == "changed"}
    if moved_stat_layers:
        parts.append(f"running statistics changed in {_plural(len(moved_stat_layers), 'layer')}")
    elif statistics and all(t.status == "unchanged" for t in statistics):
        parts.append("running statistics identical")
    parts += _appeared(statistics, "running-statistics tensor")
    if config_layers:
        parts.append(f"config changed in {_plural(len(config_layers), 'normalizer')}")
    parts += _appeared(normalizers, "normalizer")
    return ", ".join(parts)


def _appeared(rows, word: str) -> list[str]:
    """'N <word>s added' and 'M <word>s removed' for the rows with those statuses."""
    return [
        f"{_plural(count, word)} {status}"
        for status in ("added", "removed")
        if (count := sum(r.status == status for r in rows))
    ]
