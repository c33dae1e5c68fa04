"""inspect_model: every normalization layer of a model with its spec, mode, statistics and hazards.

One reader per source turns its layers into `LayerFacts` (hazards.py), and one function turns
facts into the user-facing `LayerInspection`, so a PyTorch module, an ExportedProgram, a Keras
model and an ONNX graph are judged by the same rules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from schemas import NormbridgeError, NormSpec, UnsupportedObjectError
from schemas.inspection import LayerInspection, ModelInspection, StatsSummary
from schemas.kinds import KIND_INFO

from .hazards import LayerFacts, layer_hazards, model_hazards


def inspect_path(path: str | Path) -> ModelInspection:
    """Load the model at `path` safely (see loading.load_model) and inspect it."""
    from .loading import load_model

    return inspect_model(load_model(path), source=str(path))


def inspect_model(obj: Any, *, source: str | None = None) -> ModelInspection:
    """Inspect a torch.nn.Module, a torch.export ExportedProgram, a keras.Model, an onnx.ModelProto, a NormSpec or a path."""
    if isinstance(obj, (str, Path)):
        return inspect_path(obj)
    if isinstance(obj, NormSpec):
        facts = [_spec_facts(obj)]
        return _inspection(obj.source.framework, source or f"spec '{obj.name}'", facts, [])
    from .exported_program import is_exported_program
    from .loading import framework_of_model

    if is_exported_program(obj):
        return _inspection("torch", source or "torch.export.ExportedProgram", _exported_facts(obj), [])
    framework = framework_of_model(obj)
    described = source or f"{framework} {type(obj).__name__} '{getattr(obj, 'name', '') or type(obj).__name__}'"
    if framework == "onnx":
        return _inspection("onnx", source or f"onnx graph '{obj.graph.name}'", _onnx_facts(obj), model_hazards(obj))
    if framework == "torch":
        import torch

        if not isinstance(obj, torch.nn.Module):
            raise UnsupportedObjectError(f"got a {type(obj).__module__}.{type(obj).__qualname__}, expected a torch.nn.Module or a torch.export.ExportedProgram.")
        return _inspection("torch", described, _walked_facts(obj, "module"), [])
    return _inspection("keras", described, _walked_facts(obj, "keras"), [])


# -- readers: one per source -------------------------------------------------------------


def _walked_facts(model: Any, origin: str) -> list[LayerFacts]:
    """torch.nn.Module and keras.Model: walk the layers and read each through its adapter."""
    from .walking import norm_layers, spec_of

    facts = []
    for ref in norm_layers(model):
        spec, problem = None, None
        try:
            spec = spec_of(ref)
        except NormbridgeError as error:
            problem = str(error)
        # Keras has no per-layer mode (it is chosen per call); a PyTorch module's is module.training.
        training = bool(getattr(ref.obj, "training", False)) if ref.framework == "torch" else False
        facts.append(LayerFacts(
            path=ref.path, kind=ref.kind, framework=ref.framework, origin=origin, layer_type=type(ref.obj).__name__,
            spec=spec, training=training, problem=problem,
        ))
    return facts


def _exported_facts(program: Any) -> list[LayerFacts]:
    from .exported_program import exported_norm_layers

    facts = []
    for layer in exported_norm_layers(program):
        layer_type = layer.module_type or layer.op  # the aten op stays in spec.source.layer_type
        facts.append(LayerFacts(
            path=layer.path, kind=layer.kind, framework="torch", origin="exported_program", layer_type=layer_type,
            spec=layer.spec, training=layer.training, native=layer.native, problem=None if not layer.native else layer.problem,
            op_types=() if layer.native else ("primitive ops",),
        ))
    return facts


def _onnx_facts(model: Any) -> list[LayerFacts]:
    from ..onnx_adapter.graph.sites import find_norm_sites

    facts = []
    for site in find_norm_sites(model):
        ops = tuple(site.op_types)
        distinct = tuple(dict.fromkeys(ops))
        layer_type = "+".join(distinct) if len(distinct) <= 3 else f"{len(ops)} primitive ops"  # the hazard lists them all
        facts.append(LayerFacts(
            path=site.name, kind=site.kind, framework="onnx", origin=site.origin, layer_type=layer_type, spec=site.spec,
            training=bool(site.training_mode), eps=site.eps, native=site.native, folded=site.folded, op_types=ops,
        ))
    return facts


def _spec_facts(spec: NormSpec) -> LayerFacts:
    framework = spec.source.framework if spec.source.framework in ("torch", "keras", "onnx") else "torch"
    return LayerFacts(
        path=spec.name, kind=spec.kind, framework=framework, origin="normbridge", layer_type=spec.source.layer_type or spec.kind,
        spec=spec, training=spec.training,
    )


# -- facts -> inspection ---------------------------------------------------------------


def _inspection(framework: str, source: str, facts: list[LayerFacts], hazards: list) -> ModelInspection:
    layers = [_layer(index, f) for index, f in enumerate(facts)]
    return ModelInspection(framework=framework, source=source, layers=layers, hazards=hazards)


def _layer(index: int, facts: LayerFacts) -> LayerInspection:
    return LayerInspection(
        index=index, path=facts.path, kind=facts.kind, layer_type=facts.layer_type, native=facts.native, folded=facts.folded, origin=facts.origin,
        spec=None if facts.spec is None else facts.spec.config_dict(), mode=mode_of(facts), stats=stats_summary(facts.spec),
        hazards=layer_hazards(facts),
    )


def mode_of(facts: LayerFacts) -> str:
    """train/eval where the layer's output depends on a mode, n/a elsewhere (and for Keras, whose mode is per call)."""
    # Kinds whose output depends on a train/eval flag are those with running statistics (InstanceNorm only when it tracks them).
    if facts.origin == "keras" or not KIND_INFO[facts.kind].running_stats:
        return "n/a"
    if facts.kind == "instance" and not facts.tracked:
        return "n/a"  # instance statistics are per sample in either mode
    return "train" if facts.training else "eval"


def stats_summary(spec: NormSpec | None) -> StatsSummary | None:
    """min/mean/max of running mean and variance, and whether they moved from mean 0 / var 1 (and, for BatchNorm, were counted)."""
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
        mean_min=float(mean.min()), mean_mean=float(mean.mean()), mean_max=float(mean.max()),
        var_min=float(var.min()), var_mean=float(var.mean()), var_max=float(var.max()),
        num_batches_tracked=count, updated=moved and counted,
    )
