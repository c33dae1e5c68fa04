"""inspect_model: every normalization layer of a model with its spec, mode, statistics and hazards.

The model's adapter turns its layers into `LayerFacts` (walked layers read through their kind
adapters, the aten ops of an ExportedProgram, the sites of an ONNX graph), and one function turns
facts into the user-facing `LayerInspection`, so every framework's models are judged by the same rules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from schemas import NormSpec
from schemas.inspection import LayerInspection, ModelInspection, StatsSummary
from schemas.kinds import KIND_INFO

from ..adapters import REGISTRY
from ..model_values import LayerFacts
from .hazards import convergence_unjudged, layer_hazards


def inspect_path(path: str | Path) -> ModelInspection:
    """Load the model at `path` safely (see loading.load_model) and inspect it."""
    from .loading import load_model

    return inspect_model(load_model(path, checkpoint_folders=True), source=str(path))


def inspect_model(obj: Any, *, source: str | None = None) -> ModelInspection:
    """Inspect a torch.nn.Module, a torch.export ExportedProgram, a keras.Model, an onnx.ModelProto,
    a NormSpec or a path."""
    if isinstance(obj, (str, Path)):
        return inspect_path(obj)
    if isinstance(obj, NormSpec):
        facts = [_spec_facts(obj)]
        return _inspection(obj.source.framework, source or f"spec '{obj.name}'", facts, [])
    adapter = REGISTRY.model_adapter_of(obj)
    return _inspection(
        adapter.framework,
        source or adapter.inspection_source(obj),
        adapter.layer_facts(obj),
        adapter.model_hazards(obj),
    )


def _spec_facts(spec: NormSpec) -> LayerFacts:
    framework = spec.source.framework if spec.source.framework in REGISTRY.framework_names else "torch"
    return LayerFacts(
        path=spec.name,
        kind=spec.kind,
        framework=framework,
        origin="normbridge",
        layer_type=spec.source.layer_type or spec.kind,
        spec=spec,
        training=spec.training,
    )


# -- facts -> inspection ---------------------------------------------------------------


def _inspection(framework: str, source: str, facts: list[LayerFacts], hazards: list) -> ModelInspection:
    layers = [_layer(index, f) for index, f in enumerate(facts)]
    unjudged = convergence_unjudged(facts)
    return ModelInspection(
        framework=framework, source=source, layers=layers, hazards=list(hazards) + ([unjudged] if unjudged else [])
    )


def _layer(index: int, facts: LayerFacts) -> LayerInspection:
    return LayerInspection(
        index=index,
        path=facts.path,
        kind=facts.kind,
        layer_type=facts.layer_type,
        native=facts.native,
        folded=facts.folded,
        origin=facts.origin,
        spec=None if facts.spec is None else facts.spec.config_dict(),
        mode=mode_of(facts),
        stats=stats_summary(facts.spec),
        hazards=layer_hazards(facts),
    )


def mode_of(facts: LayerFacts) -> str:
    """train/eval where the layer's output depends on a mode, n/a elsewhere (and for Keras, whose mode is per call)."""
    # Kinds whose output depends on a train/eval flag are those with running statistics
    # (InstanceNorm only when it tracks them).
    if facts.origin == "keras" or not KIND_INFO[facts.kind].running_stats:
        return "n/a"
    if facts.kind == "instance" and not facts.tracked:
        return "n/a"  # instance statistics are per sample in either mode
    return "train" if facts.training else "eval"


def stats_summary(spec: NormSpec | None) -> StatsSummary | None:
    """min/mean/max of running mean and variance, and whether they moved from mean 0 / var 1
    (and, for BatchNorm, were counted)."""
    if spec is None or "running_mean" not in spec.tensors or "running_var" not in spec.tensors:
        return None
    mean = np.asarray(spec.tensors["running_mean"], dtype=np.float64)
    var = np.asarray(spec.tensors["running_var"], dtype=np.float64)
    count = spec.tensors.get("num_batches_tracked")
    count = None if count is None else int(count)
    moved = not (bool(np.all(mean == 0)) and bool(np.all(var == 1)))
    # PyTorch's InstanceNorm never increments num_batches_tracked: only the values tell there.
    counted = count is None or count > 0 or spec.kind != "batch"
    return StatsSummary(
        mean_min=float(mean.min()),
        mean_mean=float(mean.mean()),
        mean_max=float(mean.max()),
        var_min=float(var.min()),
        var_mean=float(var.mean()),
        var_max=float(var.max()),
        num_batches_tracked=count,
        updated=moved and counted,
    )
