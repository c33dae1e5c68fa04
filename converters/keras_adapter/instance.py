"""GroupNormalization with one group per channel <-> instance spec without running statistics; a tracked one <-> BatchNormalization.

A tracked InstanceNorm in eval mode normalises with its running statistics, per channel, which is exactly what a
BatchNormalization computes at inference; a training step differs (Keras pools the batch), which the report says.
"""

from __future__ import annotations

from typing import Any

from schemas import LayerReport, NormSpec
from schemas.kinds import KIND_INFO

from .. import markers
from ..options import ConversionOptions
from ..translate import emit_momentum, record_layout
from .batch import VARIABLES as BATCH_VARIABLES
from .facts import read_facts
from .momentum import RUNNING_WEIGHT, recall_running, remember_running
from .shapes import built_input_shape, channel_layout, spatial_rank_of
from .variables import read_variables
from .groups import read_group_layer
from .facts import STORED_NOTE
from .kind_adapter import KerasKindAdapter
from .runtime import import_keras
from .shapes import build_rank, channels_last_shape
from .variables import AFFINE_VARIABLES


class KerasInstanceAdapter(KerasKindAdapter):
    """keras.layers.GroupNormalization(groups=-1) <-> kind "instance" (Keras has no InstanceNorm layer)."""

    kind = "instance"
    layer_classes = KIND_INFO["instance"].classes["keras"]
    restatable = True  # from_spec: configuration, then finish_emit writes the tensors (KerasKindAdapter.restate)

    def to_spec(self, obj: Any, report: LayerReport) -> NormSpec:
        if isinstance(obj, import_keras().layers.BatchNormalization) and markers.recall(obj).get("kind") == "instance":
            return read_tracked_instance(obj, report)
        return read_group_layer(self.layer_of(obj), report, "instance")

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> Any:
        common = self.begin_emit(spec, report)
        if spec.track_running_stats:
            return emit_tracked_instance(spec, common, options, report)
        record_layout(report, spec, "channels_last")
        # groups=-1: one group per channel, Keras's documented instance normalisation.
        layer = import_keras().layers.GroupNormalization(groups=-1, axis=-1, center=spec.bias, scale=spec.scale, **common)
        rank = build_rank(spec, report, spec.spatial_rank + 2, minimum=3)
        if spec.momentum is not None:  # unused without tracked statistics; GroupNormalization has none
            report.add("momentum", spec.momentum, spec.momentum, "stored", "unused: statistics are not tracked; " + STORED_NOTE)
            markers.remember(layer, momentum=spec.momentum, momentum_convention=spec.momentum_convention)
        return self.finish_emit(layer, spec, report, channels_last_shape(spec.num_features, rank), AFFINE_VARIABLES)


def emit_tracked_instance(spec: NormSpec, common: dict, options: ConversionOptions, report: LayerReport) -> Any:
    """BatchNormalization holding the running statistics: eval is exact, a training step is not (the warning says how)."""
    momentum = emit_momentum(report, spec, RUNNING_WEIGHT, options, "keras")
    record_layout(report, spec, "channels_last")
    report.add("track_running_stats", True, "BatchNormalization", "approximate", "eval mode exact: the running statistics, per channel")
    report.warn(
        "a tracked InstanceNorm was emitted as a Keras BatchNormalization: eval mode is exact (running statistics), but a training step "
        "normalises with statistics pooled over the whole batch instead of per instance, and updates the moving statistics with them; "
        "train the source layer instead.")
    layer = import_keras().layers.BatchNormalization(axis=-1, momentum=momentum, center=spec.bias, scale=spec.scale, **common)
    remember_running(layer, spec, report, momentum)
    markers.remember(layer, kind="instance")
    rank = build_rank(spec, report, spec.spatial_rank + 2, minimum=3)
    return KerasInstanceAdapter().finish_emit(layer, spec, report, channels_last_shape(spec.num_features, rank), BATCH_VARIABLES)


def read_tracked_instance(layer: Any, report: LayerReport) -> NormSpec:
    """The tracked instance spec a BatchNormalization emitted by emit_tracked_instance stands for."""
    shape = built_input_shape(layer)
    running = recall_running(layer, report, float(layer.momentum))
    return read_facts(layer, report).spec(
        layer, "instance", {**read_variables(layer, BATCH_VARIABLES), **running.pop("tensors")},
        num_features=int(layer.moving_mean.shape[0]), spatial_rank=spatial_rank_of(layer, len(shape), 2), input_rank=len(shape),
        layout=channel_layout(layer, layer.axis, len(shape)), track_running_stats=True,
        variance_estimator="biased",  # what a Keras BatchNormalization's training step uses, as for kind batch
        scale=bool(layer.scale), bias=bool(layer.center), **running)


ADAPTER = KerasInstanceAdapter
