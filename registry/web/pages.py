"""What each page shows, computed from the Registry: plain dicts and SVG strings for the templates.

Kept apart from the routes so the numbers on a page (per-channel movement, equivalence errors,
the layer table) come from one function each, the same for every caller.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

import numpy as np

from converters.models.inspection import inspect_model
from registry.http.redaction import Redactor
from registry.service.servable import stored_layer_hazards
from registry.tensor_blobs import tensor_from_blob
from schemas.hazard_groups import HazardGroup, group_hazard_dicts
from schemas.inspection import momentum_text
from schemas.manifest import TensorRef, load_manifest

from .svg import ChannelMovement, GraphNode, lineage_svg, movement_svg, threshold_bars_svg

#: Lineage graphs beyond this many versions are drawn up to it (the rest is listed as text).
MAX_GRAPH_NODES = 400
#: The box of a version outside the viewer's scope (the placeholder itself is too long for a box).
HIDDEN_LABEL = "outside your scope"
#: Per-channel plots beyond this many layers show the layers that moved most.
MAX_PLOTTED_LAYERS = 40
#: What the equivalence table says of a target that was not converted: never "ok", which reads as a checked pass.
UNCONVERTED_OUTCOMES = {"not_expressible": "not converted", "skipped": "skipped"}
#: The CSS class of each outcome of the equivalence table.
OUTCOME_CLASSES = {"ok": "passed", "FAILED": "failed", "not converted": "unconverted", "skipped": "unconverted"}


def version_url(model: str, number: int | str) -> str:
    return f"/ui/models/{quote(model, safe='')}/versions/{quote(str(number), safe='')}"


def model_url(model: str) -> str:
    return f"/ui/models/{quote(model, safe='')}"


def diff_url(a: str, b: str) -> str:
    return "/ui/diff?" + urlencode({"a": a, "b": b})


def split(ref: str) -> tuple[str, int]:
    name, _, number = ref.rpartition("@")
    return name, int(number)


def verdict(record) -> str:
    """'passed' / 'failed' / 'none' from the equivalence results stored in the manifest; 'incomplete' when it was
    registered with --allow-unrecognised (some normalization was not checked), however its checks went."""
    results = record.manifest.get("equivalence") or []
    if results and not all(r.get("passed") for r in results):
        return "failed"
    if record.manifest.get("unrecognised"):
        return "incomplete"
    return "passed" if results else "none"


def row_verdict(record) -> str:
    """The verdict a versions table shows: 'not servable' when a hazard blocks serving (the equivalence verdict would
    read as green), else the equivalence verdict."""
    return "not servable" if record.servable is False else verdict(record)


def warning_codes(record) -> list[str]:
    """The codes of a servable version's recorded hazards that do not block serving (unconverged_statistics,
    momentum_none, ...): the versions table names them beside the verdict, so a green row still says what to look at."""
    if record.servable is False:
        return []
    return list(dict.fromkeys(h["code"] for h in record.hazards if not h.get("blocking")))


def serving_rows(record) -> list[HazardGroup]:
    """The hazards stored with a version, blocking ones first, one row per distinct hazard with its layers
    (schemas/hazard_groups.py): 59 identical rows made a page 26,850 px tall. The API keeps one entry per layer."""
    return group_hazard_dicts(sorted(record.hazards, key=lambda h: not h.get("blocking")))


# --------------------------------------------------------------------------- models


def model_rows(registry, name: str, redactor: Redactor, limit: int | None = None) -> dict:
    """A model with its versions (newest first, at most `limit`), each with its alias badges and equivalence verdict.

    A parent outside the viewer's scope is shown by its placeholder (as the API's Version.parent is),
    never named or linked.
    """
    records = registry.versions(name)
    total = len(records)
    aliases = registry.aliases(name)
    by_number: dict[int, list[str]] = {}
    for alias in aliases:
        by_number.setdefault(alias.number, []).append(alias.alias)
    latest = max(r.number for r in records)
    versions = []
    shown = list(reversed(records))[: limit or None]
    for record in map(redactor.version, shown):
        visible_parent = record.parent is not None and not redactor.is_hidden(record.parent)
        badges = sorted(by_number.get(record.number, []))
        if record.number == latest:
            badges = ["latest", *badges]
        versions.append(
            {
                "record": record,
                "url": version_url(record.model, record.number),
                "aliases": badges,
                "verdict": row_verdict(record),
                "warnings": warning_codes(record),
                "layers": len(record.manifest.get("normalizers", [])),
                "parent_url": version_url(*split(record.parent)) if visible_parent else None,
                "diff_url": diff_url(record.parent, record.ref) if visible_parent else None,
            }
        )
    latest_servable = next(r.servable for r in records if r.number == latest)
    return {
        "name": name,
        "url": model_url(name),
        "versions": versions,
        "aliases": aliases,
        "total": total,
        "hidden": total - len(shown),
        "latest_servable": latest_servable is not False,
    }


# --------------------------------------------------------------------------- a version


def _momentum(spec: dict) -> str:
    return momentum_text({"track_running_stats": spec.get("kind") in ("batch", "instance"), **spec})


def layer_rows(registry, record) -> list[dict]:
    """Every normalization layer of a version: settings, mode, statistics summary and hazards
    (from the stored specs)."""
    manifest = load_manifest(record.manifest)
    specs = registry.specs(record.ref)  # re-hashes every blob it reads: tampered bytes are never shown
    rows = []
    for entry, spec in zip(manifest.normalizers, specs):
        layer = inspect_model(spec).layers[0]
        hazards = stored_layer_hazards(manifest, entry.path, spec)  # worded by the stored format, as the verdict is
        config = entry.spec
        rows.append(
            {
                "path": entry.path,
                "kind": config.get("kind"),
                "layer_type": (config.get("source") or {}).get("layer_type") or "",
                "eps": config.get("eps"),
                "momentum": _momentum(config),
                "mode": "train" if config.get("training") else layer.mode,
                "dtype": config.get("dtype"),
                "features": config.get("num_features") or config.get("normalized_shape"),
                "stats": layer.stats,
                "hazards": hazards,
            }
        )
    return rows


def equivalence_rows(record) -> list[dict]:
    """Per layer and framework pair (source -> target): max abs / rel error in eval and the training-step errors."""
    rows = []
    for result in record.manifest.get("equivalence") or []:
        source = result.get("source_framework", "?")
        steps = {s.get("framework"): s for s in result.get("training_step") or []}
        statuses = {t.get("framework"): t for t in result.get("targets") or []}
        for output in result.get("outputs") or []:
            framework = output.get("framework")
            step = steps.get(framework) or {}
            target = statuses.get(framework) or {}
            rows.append(
                {
                    "layer": result.get("layer"),
                    "pair": f"{source} → {framework}",
                    "max_abs": output.get("max_abs_error"),
                    "max_rel": output.get("max_rel_error"),
                    "atol": output.get("atol"),
                    "rtol": output.get("rtol"),
                    "passed": output.get("passed"),
                    "mean_err": step.get("max_abs_error_mean"),
                    "var_err": step.get("max_abs_error_var"),
                    "warnings": target.get("warnings") or [],
                    "outcome": "ok" if output.get("passed") else "FAILED",
                }
            )
        for framework, target in statuses.items():
            if target.get("status") in ("not_expressible", "skipped", "failed") and framework not in {
                o.get("framework") for o in result.get("outputs") or []
            }:
                rows.append(
                    {
                        "layer": result.get("layer"),
                        "pair": f"{source} → {framework}",
                        "status": target.get("status"),
                        "reason": target.get("reason"),
                        "passed": target.get("status") != "failed",
                        "warnings": target.get("warnings") or [],
                        "outcome": UNCONVERTED_OUTCOMES.get(target.get("status"), "FAILED"),
                    }
                )
    return rows


# --------------------------------------------------------------------------- lineage


def lineage_graph(view, redactor: Redactor) -> tuple[str, list[dict], int]:
    """(SVG, rows for the text list, versions not drawn) of a LineageView already passed through `redactor`.

    Versions of models outside the viewer's scope are drawn as a box without a name, a link or a note.
    """
    nodes, rows = [], []
    for node in view.nodes:
        visible = not redactor.is_hidden(node.ref)
        label = node.ref if visible else HIDDEN_LABEL
        href = version_url(*split(node.ref)) if visible else None
        nodes.append(
            GraphNode(
                ref=node.ref,
                parent=node.parent,
                depth=node.depth,
                operation=node.operation,
                note=node.note if visible else None,
                target=node.target,
                href=href,
                label=label,
            )
        )
        rows.append(
            {
                "label": label,
                "url": href,
                "operation": node.operation,
                "depth": node.depth,
                "target": node.target,
                "parent": node.parent,
                "created_at": node.created_at,
            }
        )
    drawn = nodes[:MAX_GRAPH_NODES]
    return lineage_svg(drawn), rows, len(nodes) - len(drawn)


# --------------------------------------------------------------------------- diff


def _statistics(registry, record, entry) -> tuple[np.ndarray, np.ndarray] | None:
    manifest_tensors = record.manifest.get("tensors", {})
    names = entry.get("tensors", {})
    if "running_mean" not in names or "running_var" not in names:
        return None

    arrays = []
    for role in ("running_mean", "running_var"):
        name = names[role]
        ref = TensorRef.model_validate(manifest_tensors[name])
        arrays.append(tensor_from_blob(registry.store.get(ref.digest), ref, name).astype(np.float64).reshape(-1))
    return arrays[0], arrays[1]


def channel_movements(registry, a, b, layers: list[str]) -> list[ChannelMovement]:
    """Per-channel movement of the running statistics of `layers` from version a to b
    (only blobs that differ are read)."""
    entries_a = {e["path"]: e for e in a.manifest.get("normalizers", [])}
    entries_b = {e["path"]: e for e in b.manifest.get("normalizers", [])}
    moved = []
    for path in layers:
        if path not in entries_a or path not in entries_b:
            continue
        before, after = _statistics(registry, a, entries_a[path]), _statistics(registry, b, entries_b[path])
        if before is None or after is None or before[0].shape != after[0].shape:
            continue
        eps = float(entries_a[path]["spec"].get("eps") or 0.0)
        (mean_a, var_a), (mean_b, var_b) = before, after
        with np.errstate(divide="ignore", invalid="ignore"):
            shift = (mean_b - mean_a) / np.sqrt(np.maximum(var_a, 0.0) + eps)
            ratio = np.log((np.maximum(var_b, 0.0) + eps) / (np.maximum(var_a, 0.0) + eps))
        moved.append(ChannelMovement(layer=path, mean_shift=np.nan_to_num(shift), log_var_ratio=np.nan_to_num(ratio)))
    moved.sort(key=lambda m: -float(np.max(np.abs(m.mean_shift), initial=0.0)))
    kept = moved[:MAX_PLOTTED_LAYERS]
    order = {path: i for i, path in enumerate(layers)}
    return sorted(kept, key=lambda m: order[m.layer])


def movement_plot(registry, a, b, diff) -> str:
    return movement_svg(channel_movements(registry, a, b, list(diff.statistics_changed_layers)))


# --------------------------------------------------------------------------- drift


def drift_charts(report) -> tuple[str, str]:
    """(standardized-shift chart, log-variance-ratio chart) of a DriftReport, each against its threshold."""
    names = [layer.name for layer in report.layers]
    shift = threshold_bars_svg(
        names,
        [layer.max_shift for layer in report.layers],
        report.thresholds.shift,
        "max standardized mean shift per layer |mean − running_mean| / √(running_var + eps)",
        secondary=[layer.mean_shift for layer in report.layers],
        secondary_name="mean over channels",
    )
    ratio = threshold_bars_svg(
        names,
        [layer.max_abs_log_ratio for layer in report.layers],
        report.thresholds.log_ratio,
        "max |log variance ratio| per layer",
        secondary=[layer.mean_abs_log_ratio for layer in report.layers],
        secondary_name="mean over channels",
    )
    return shift, ratio


__all__ = [
    "OUTCOME_CLASSES",
    "channel_movements",
    "diff_url",
    "drift_charts",
    "equivalence_rows",
    "layer_rows",
    "lineage_graph",
    "model_rows",
    "model_url",
    "movement_plot",
    "row_verdict",
    "serving_rows",
    "verdict",
    "version_url",
    "warning_codes",
]
