"""Port normalization state between twin models: a PyTorch network and its Keras twin, or back.

    report = port_state(torch_model, keras_model)       # writes into keras_model's own layers
    print(report.render_text())

Every normalization layer of the source is paired with one of the target: by order, checked by kind and shape
(num_features, num_groups, normalized_shape, spatial rank, dtype), or through an explicit name map `{source path: target
path or name}`. Layers the map does not name are paired by order among the layers it does not name either, so a map only
has to fix the pairs that order gets wrong; when those layers have the same names on both sides (each name once), they
pair by name, since a torch module's definition order need not be the order its twin calls them in, and order is refused
where it would pair a layer with another than its namesake. Each pair goes through the converters (source layer -> spec
-> the target framework's layer), so eps, momentum and their conventions are translated and refused exactly as a
conversion does and the report uses the same vocabulary; the converted state is then written into the target's existing
layer, bit-exactly.

Everything is checked before anything is written, and a failure while writing puts every
target layer back, so a refused port leaves the target as it was.

Sources: torch.nn.Module, torch.export.ExportedProgram (.pt2), keras.Model, and onnx.ModelProto
(native normalization nodes only; decompositions and BatchNorms folded into a Conv are not
layers there). Targets: torch.nn.Module or keras.Model, changed in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas import ConversionReport, LayerReport, NormSpec, SpecError
from schemas.kinds import KIND_INFO

from ..adapters import REGISTRY
from ..api import layer_spec, write_spec
from ..model_adapter import ModelAdapter
from ..model_values import NormLayerRef
from ..options import ConversionOptions
from ..translate import estimator_matches, record_layout

#: Report lines the converter writes for a new layer that a port replaces with the target layer's own facts.
_RETARGETED = ("name", "layout", "input_rank", "variance_estimator")
_ESTIMATOR_WARNING = "one training step moves running_var differently"
_EXAMPLES = 3


class PortMismatchError(SpecError):
    """The source and target models are not twins: layer counts, kinds, shapes or names do not pair up."""

    code = "port_mismatch"


@dataclass(frozen=True)
class SourceLayer:
    """One normalization layer of the source model: its path (or name) and spec."""

    path: str
    spec: NormSpec


@dataclass(frozen=True)
class TargetLayer:
    """One normalization layer of the target model, with the spec read from it before the port."""

    ref: NormLayerRef
    spec: NormSpec

    @property
    def path(self) -> str:
        return self.ref.path


@dataclass(frozen=True)
class Pair:
    source: SourceLayer
    target: TargetLayer
    how: str


# -- reading both sides ----------------------------------------------------------------------


def source_layers(model: Any) -> list[SourceLayer]:
    """The normalization layers of a source model, in order, as specs named by their paths."""
    return [SourceLayer(spec.name, spec) for spec in REGISTRY.model_adapter_of(model).layer_specs(model)]


def target_layers(model: Any) -> tuple[ModelAdapter, list[TargetLayer]]:
    """(model adapter, layers) of a target model, which must be an in-memory model its framework can change in place."""
    adapter = REGISTRY.model_adapter_of(model)
    return adapter, [TargetLayer(ref, layer_spec(ref)) for ref in adapter.port_targets(model)]


# -- pairing -----------------------------------------------------------------------------------


def describe(spec: NormSpec) -> str:
    """Kind and shape of a layer as one phrase, e.g. 'batch num_features=16 (2d)'."""
    if KIND_INFO[spec.kind].trailing:
        return f"{spec.kind} normalized_shape={list(spec.normalized_shape)}"
    text = f"{spec.kind} num_features={spec.num_features}"
    if spec.kind == "group":
        text += f" num_groups={spec.num_groups}"
    if spec.spatial_rank is not None:
        text += f" ({spec.spatial_rank}d)"
    return text


def _signature(spec: NormSpec) -> tuple:
    if KIND_INFO[spec.kind].trailing:
        return (spec.kind, tuple(spec.normalized_shape))
    if spec.kind == "group" or (spec.kind == "instance" and not spec.track_running_stats):
        # GroupNorm with one group per channel computes InstanceNorm without statistics (and Keras has only the former).
        groups = spec.num_features if spec.kind == "instance" else spec.num_groups
        return ("group", spec.num_features, groups)
    return (spec.kind, spec.num_features, spec.spatial_rank)


def _examples(names: list[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:_EXAMPLES])
    return shown + (f" and {len(names) - _EXAMPLES} more" if len(names) > _EXAMPLES else "")


def match_layers(
    sources: list[SourceLayer],
    targets: list[TargetLayer],
    name_map: dict[str, str] | None = None,
    source_note: str = "",
) -> list[Pair]:
    """Pair every source layer with one target layer: the name map first, then by order among the rest.

    `source_note` is added to a count mismatch: what the source's framework offers as layers
    (ModelAdapter.port_source_note).
    """
    name_map = dict(name_map or {})
    for key, value in name_map.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise PortMismatchError(
                f"the name map holds {key!r}: {value!r}, expected source path strings mapped to target path strings.",
                setting="name_map",
            )
    source_paths, target_paths = [s.path for s in sources], [t.path for t in targets]
    by_source = {s.path: s for s in sources}
    by_target = {t.path: t for t in targets}
    unknown = [k for k in name_map if k not in by_source]
    if unknown:
        raise PortMismatchError(
            f"the name map names source layer(s) {_examples(unknown)} that the source model does not have (its {len(sources)} normalization "
            f"layers include {_examples(source_paths)}); use the paths `normbridge inspect` lists.",
            layer=unknown[0],
            setting="name_map",
        )
    unknown = [v for v in name_map.values() if v not in by_target]
    if unknown:
        raise PortMismatchError(
            f"the name map names target layer(s) {_examples(unknown)} that the target model does not have (its {len(targets)} normalization "
            f"layers include {_examples(target_paths)}); use the target's module paths (PyTorch) or layer names (Keras).",
            layer=unknown[0],
            setting="name_map",
        )
    reused = sorted({v for v in name_map.values() if list(name_map.values()).count(v) > 1})
    if reused:
        raise PortMismatchError(
            f"the name map sends several source layers to target layer(s) {_examples(reused)}, expected one each.",
            layer=reused[0],
            setting="name_map",
        )
    ambiguous = sorted({p for p in target_paths if target_paths.count(p) > 1} & set(name_map.values()))
    if ambiguous:
        raise PortMismatchError(
            f"the target has several normalization layers named {_examples(ambiguous)}, so the name map cannot pick one.",
            layer=ambiguous[0],
            setting="name_map",
        )
    rest_sources = [s for s in sources if s.path not in name_map]
    mapped_targets = set(name_map.values())
    rest_targets = [t for t in targets if t.path not in mapped_targets]
    if len(rest_sources) != len(rest_targets):
        extra_side, extra = (
            ("source", [s.path for s in rest_sources[len(rest_targets) :]])
            if len(rest_sources) > len(rest_targets)
            else ("target", [t.path for t in rest_targets[len(rest_sources) :]])
        )
        other = "target" if extra_side == "source" else "source"
        scope = " among the layers the name map does not name" if name_map else ""
        raise PortMismatchError(
            f"the source has {len(sources)} normalization layers and the target {len(targets)}: paired by order{scope}, {extra_side} layer(s) "
            f"{_examples(extra)} have no twin in the {other}; port between models of the same architecture{source_note}.",
            layer=extra[0],
            setting="layer_count",
        )
    if _same_names(rest_sources, rest_targets):
        named = {t.path: t for t in rest_targets}
        return [
            Pair(s, by_target[name_map[s.path]], "name map")
            if s.path in name_map
            else Pair(s, named[s.path], "by name")
            for s in sources
        ]
    order = iter(rest_targets)
    pairs = []
    for index, source in enumerate(sources, start=1):
        if source.path in name_map:
            pairs.append(Pair(source, by_target[name_map[source.path]], "name map"))
        else:
            pairs.append(Pair(source, next(order), f"by order, layer {index} of {len(sources)}"))
    _refuse_order_against_names(pairs, {t.path for t in rest_targets})
    return pairs


def _same_names(sources: list[SourceLayer], targets: list[TargetLayer]) -> bool:
    """Both sides name their layers alike, each name once: twins whose definition orders differ still pair by name."""
    names = [s.path for s in sources]
    return len(set(names)) == len(names) and sorted(names) == sorted(t.path for t in targets)


def _refuse_order_against_names(pairs: list[Pair], target_names: set[str]) -> None:
    """Order may not send a source layer elsewhere than to the target layer of its own name: one of the two is wrong."""
    crossed = [
        p
        for p in pairs
        if p.how.startswith("by order") and p.source.path != p.target.path and p.source.path in target_names
    ]
    if crossed:
        first = crossed[0]
        raise PortMismatchError(
            f"paired by order, source layer '{first.source.path}' would go to target '{first.target.path}', but the target has a layer "
            f"named '{first.source.path}'; pass a name map for the layers whose names or order differ.",
            layer=first.source.path,
            setting="name_map",
        )


def _first_difference(a: NormSpec, b: NormSpec) -> str:
    """The first spec field (kind, then the shape fields) on which two layers' signatures differ."""
    if _signature(a)[0] != _signature(b)[0]:
        return "kind"
    for name in ("num_features", "num_groups", "normalized_shape", "spatial_rank"):
        if getattr(a, name) != getattr(b, name):
            return name
    return "kind"


def check_twins(pairs: list[Pair]) -> None:
    """Refuse pairs whose kind, shape or dtype differ, naming every pair that does (up to a few)."""
    differing = [p for p in pairs if _signature(p.source.spec) != _signature(p.target.spec)]
    if differing:
        first = differing[0]
        details = "; ".join(
            f"source '{p.source.path}' is {describe(p.source.spec)} but target '{p.target.path}' is {describe(p.target.spec)}"
            for p in differing[:_EXAMPLES]
        )
        more = f" (and {len(differing) - _EXAMPLES} more pairs)" if len(differing) > _EXAMPLES else ""
        setting = _first_difference(first.source.spec, first.target.spec)
        raise PortMismatchError(
            f"{len(differing)} of {len(pairs)} layer pairs differ in kind or shape: {details}{more}; the models are not twins, "
            "or pairing by order is wrong for them: pass a name map.",
            layer=first.source.path,
            setting=setting,
        )
    for p in pairs:
        if p.source.spec.dtype != p.target.spec.dtype:
            raise PortMismatchError(
                f"the source layer is {p.source.spec.dtype} but target '{p.target.path}' holds {p.target.spec.dtype} variables, and state is copied "
                "bit-exactly; cast one model so both use the same dtype.",
                layer=p.source.path,
                setting="dtype",
            )


# -- planning and writing ----------------------------------------------------------------------


def _plan(pair: Pair, adapter: ModelAdapter, options: ConversionOptions) -> tuple[LayerReport, Any]:
    """Convert the source layer for the target framework (all refusals happen here) and plan the writes."""
    spec, target, framework = pair.source.spec, pair.target, adapter.framework
    report = LayerReport(
        layer=pair.source.path,
        kind=spec.kind,
        source_framework=spec.source.framework,
        target_framework=framework,
        target_op="?",
    )
    # The target layer's class decides the running-variance estimator: it is reported below, not emitted.
    fresh, report = write_spec(spec, framework, options.model_copy(update={"match_variance_estimator": False}), report)
    _retarget(report, pair, framework, options)
    return report, adapter.plan_port_write(fresh, target.ref.obj, pair.source.path, report)


def _retarget(report: LayerReport, pair: Pair, framework: str, options: ConversionOptions) -> None:
    """Replace the facts of the converter's new layer by those of the existing target layer."""
    spec, target = pair.source.spec, pair.target.spec
    report.translations = [t for t in report.translations if t.setting not in _RETARGETED]
    report.warnings = [w for w in report.warnings if not w.startswith(_ESTIMATOR_WARNING)]
    same = pair.source.path == pair.target.path
    report.add("layer", pair.source.path, pair.target.path, "exact" if same else "translated", f"paired {pair.how}")
    report.translations.insert(0, report.translations.pop())
    record_layout(report, spec, target.layout)
    if target.input_rank is not None and spec.input_rank != target.input_rank:
        reason = "not recorded by the source" if spec.input_rank is None else "the target layer's own input rank"
        report.add(
            "input_rank",
            spec.input_rank,
            target.input_rank,
            "translated",
            f"{reason}; the target layer is built for rank-{target.input_rank} inputs",
        )
    elif spec.input_rank is not None:
        report.add("input_rank", spec.input_rank)
    if spec.track_running_stats and target.variance_estimator is not None:
        estimator_matches(report, spec, target.variance_estimator, framework, can_match=False, options=options)
    report.target_op = type(pair.target.ref.obj).__name__
    report.native = True


def port_state(
    source_model: Any,
    target_model: Any,
    name_map: dict[str, str] | None = None,
    options: ConversionOptions | None = None,
) -> ConversionReport:
    """Copy every normalization layer's state (scale, bias, statistics, eps, momentum) from `source_model` into
    `target_model`.

    Args:
        source_model: torch.nn.Module, torch.export.ExportedProgram, keras.Model or onnx.ModelProto.
        target_model: torch.nn.Module or keras.Model; its existing layers are written in place.
        name_map: optional {source layer path: target layer path (PyTorch) or name (Keras)}; the
            layers it does not name are paired by name when both sides use the same names, else by order.
        options: conversion options (`cumulative_momentum` for PyTorch momentum=None into Keras).
            `match_variance_estimator` is not used: the target layer's class decides.

    Returns:
        The ConversionReport, one LayerReport per pair (named by the source path).

    Raises:
        PortMismatchError: counts, kinds, shapes or dtypes differ, or the name map names unknown layers.
        NotExpressibleError: a target layer cannot hold a source setting (a missing affine weight,
            momentum=None into Keras, statistics the target does not track).
        Nothing is written when any of these is raised.
    """
    options = options or ConversionOptions()
    adapter, targets = target_layers(target_model)
    sources = source_layers(source_model)
    pairs = match_layers(sources, targets, name_map, REGISTRY.model_adapter_of(source_model).port_source_note)
    check_twins(pairs)
    planned = [_plan(pair, adapter, options) for pair in pairs]
    _write([plan for _, plan in planned], adapter)
    adapter.after_port(target_model)
    return ConversionReport(layers=[report for report, _ in planned])


def _write(plans: list[Any], adapter: ModelAdapter) -> None:
    """Run every planned write; on any failure put all target layers back and re-raise."""
    restores = [adapter.snapshot(plan.target) for plan in plans]
    try:
        for plan in plans:
            for step in plan.steps:
                step()
    except BaseException:
        for restore in restores:
            restore()
        raise


__all__ = [
    "Pair",
    "PortMismatchError",
    "SourceLayer",
    "TargetLayer",
    "check_twins",
    "describe",
    "match_layers",
    "port_state",
    "source_layers",
    "target_layers",
]
