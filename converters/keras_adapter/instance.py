"""GroupNormalization with one group per channel <-> instance spec without running statistics; a tracked one <->
TrackedInstanceNormalization (tracked_instance_normalization.py).

A tracked InstanceNorm in eval mode normalises with its running statistics, per channel, which is what a
BatchNormalization computes at inference; its training step normalises per instance and moves the statistics by the
batch mean of the per-instance ones, which TrackedInstanceNormalization does as PyTorch does.
"""

from __future__ import annotations

from typing import Any

from schemas import LayerReport, NormSpec
from schemas.kinds import KIND_INFO

from .. import markers
from ..options import ConversionOptions
from ..translate import emit_momentum, estimator_matches
from .batch import VARIABLES as BATCH_VARIABLES
from .facts import read_facts, without_training
from .momentum import RUNNING_WEIGHT, recall_running, remember_running
from .shapes import built_input_shape, channel_layout, spatial_rank_of
from .variables import read_variables
from .groups import read_group_layer
from .facts import STORED_NOTE
from .kind_adapter import KerasKindAdapter
from .layouts import chosen_layout_of, emit_layout
from .runtime import import_keras
from .shapes import build_rank, channel_shape
from .variables import AFFINE_VARIABLES


class KerasInstanceAdapter(KerasKindAdapter):
    """keras.layers.GroupNormalization(groups=-1) <-> kind "instance" (Keras has no InstanceNorm layer)."""

    kind = "instance"
    layer_classes = KIND_INFO["instance"].classes["keras"]
    restatable = True  # from_spec: configuration, then finish_emit writes the tensors (KerasKindAdapter.restate)

    def to_spec(self, obj: Any, report: LayerReport) -> NormSpec:
        if is_tracked_instance(obj):
            return read_tracked_instance(obj, report)
        return read_group_layer(self.layer_of(obj), report, "instance")

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> Any:
        common = self.begin_emit(spec, report)
        if spec.track_running_stats:
            return emit_tracked_instance(spec, common, options, report)
        axis, layout = emit_layout(spec, report)
        # groups=-1: one group per channel, Keras's documented instance normalisation.
        layer = import_keras().layers.GroupNormalization(
            groups=-1, axis=axis, center=spec.bias, scale=spec.scale, **common
        )
        rank = build_rank(spec, report, spec.spatial_rank + 2, minimum=3)
        if spec.momentum is not None:  # unused without tracked statistics; GroupNormalization has none
            report.add(
                "momentum", spec.momentum, spec.momentum, "stored", "unused: statistics are not tracked; " + STORED_NOTE
            )
            markers.remember(layer, momentum=spec.momentum, momentum_convention=spec.momentum_convention)
        return self.finish_emit(layer, spec, report, channel_shape(spec.num_features, rank, layout), AFFINE_VARIABLES)


def emit_tracked_instance(spec: NormSpec, common: dict, options: ConversionOptions, report: LayerReport) -> Any:
    """TrackedInstanceNormalization holding the running statistics: eval and a training step both as the source's."""
    from .tracked_instance_normalization import TrackedInstanceNormalization

    momentum = emit_momentum(report, spec, RUNNING_WEIGHT, options, "keras")
    # No empty-batch warning (translate.warn_empty_batch): on an empty batch PyTorch's tracked InstanceNorm writes NaN
    # into its running statistics (the mean over no instances), and this layer does the same.
    axis, layout = emit_layout(spec, report)
    report.add(
        "track_running_stats",
        True,
        "TrackedInstanceNormalization",
        "exact",
        "eval: the running statistics per channel; a training step: per-instance statistics, the running ones moved "
        "by their batch mean",
    )
    # PyTorch's unbiased estimator is the layer's own (the only framework with a tracked InstanceNorm); another source's
    # (a biased spec from ONNX) is held with match_variance_estimator=True, as for a BatchNorm.
    estimator = estimator_matches(report, spec, "unbiased", "keras", can_match=True, options=options)
    rank = build_rank(spec, report, spec.spatial_rank + 2, minimum=spec.spatial_rank + 1)
    if rank == spec.spatial_rank + 1:
        report.add(
            "no_batch_dim", None, True, "exact", f"rank-{rank} inputs without a batch axis: each input is one instance"
        )
    layer = TrackedInstanceNormalization(
        spatial_rank=spec.spatial_rank,
        variance_estimator=estimator,
        axis=axis,
        momentum=momentum,
        center=spec.bias,
        scale=spec.scale,
        **common,
    )
    remember_running(layer, spec, report, momentum)
    return KerasInstanceAdapter().finish_emit(
        layer, spec, report, channel_shape(spec.num_features, rank, layout), BATCH_VARIABLES
    )


def read_tracked_instance(layer: Any, report: LayerReport) -> NormSpec:
    """The tracked instance spec of a TrackedInstanceNormalization (or of a BatchNormalization an older normbridge
    marked)."""
    from .tracked_instance_normalization import TrackedInstanceNormalization

    shape = built_input_shape(layer)
    running = recall_running(layer, report, float(layer.momentum))
    own = isinstance(layer, TrackedInstanceNormalization)
    facts = read_facts(layer, report)
    layout = channel_layout(layer, layer.axis, len(shape))
    if not layer.trainable:
        # keras/src/layers/normalization/batch_normalization.py: `if training and self.trainable`.
        report.warn(
            "trainable=False: Keras runs this layer in inference mode even when called with training=True (moving "
            "statistics used, never updated); the spec records training=False."
        )
        facts = without_training(facts)
    return facts.spec(
        layer,
        "instance",
        {**read_variables(layer, BATCH_VARIABLES), **running.pop("tensors")},
        num_features=int(layer.moving_mean.shape[0]),
        spatial_rank=layer.spatial_rank if own else spatial_rank_of(layer, len(shape), 2),
        input_rank=len(shape),
        layout=layout,
        chosen_layout=chosen_layout_of(layout),
        track_running_stats=True,
        variance_estimator=layer.variance_estimator if own else "biased",
        scale=bool(layer.scale),
        bias=bool(layer.center),
        **running,
    )


ADAPTER = KerasInstanceAdapter


def is_tracked_instance(obj: Any) -> bool:
    """A TrackedInstanceNormalization, or a BatchNormalization an older normbridge emitted for a tracked
    InstanceNorm."""
    layers = import_keras().layers
    if not isinstance(obj, layers.BatchNormalization):
        return False
    from .tracked_instance_normalization import TrackedInstanceNormalization

    return isinstance(obj, TrackedInstanceNormalization) or markers.recall(obj).get("kind") == "instance"
