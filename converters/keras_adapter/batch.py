"""BatchNormalization <-> batch spec: per-channel statistics, moving averages used at inference."""

from __future__ import annotations

from typing import Any

from schemas import LayerReport, NormSpec, NotExpressibleError
from schemas.kinds import KIND_INFO

from .. import markers
from ..options import ConversionOptions
from ..translate import emit_momentum, estimator_matches, warn_empty_batch
from .deferred import channel_build_shape, deferred_spec, is_deferred
from .facts import read_facts, without_training
from .kind_adapter import KerasKindAdapter
from .layouts import chosen_layout_of, emit_layout
from .momentum import RUNNING_WEIGHT, recall_running, remember_running
from .runtime import import_keras
from .shapes import built_input_shape, channel_layout, spatial_rank_of
from .variables import AFFINE_VARIABLES, read_variables

#: Spec tensor -> BatchNormalization variable.
VARIABLES = {**AFFINE_VARIABLES, "running_mean": "moving_mean", "running_var": "moving_variance"}


class KerasBatchAdapter(KerasKindAdapter):
    """keras.layers.BatchNormalization (and UnbiasedBatchNormalization) <-> kind "batch"."""

    kind = "batch"
    layer_classes = KIND_INFO["batch"].classes["keras"]
    holds = KerasKindAdapter.holds | {"frozen", "synchronized"}
    restatable = True  # from_spec: configuration, then finish_emit writes the tensors (KerasKindAdapter.restate)

    def to_spec(self, obj: Any, report: LayerReport) -> NormSpec:
        from .unbiased_batch_normalization import UnbiasedBatchNormalization

        layer = self.layer_of(obj)
        if is_deferred(layer):  # not built yet: what its first call builds
            return deferred_spec(layer, lambda built: self.to_spec(built, report))
        if layer.renorm:
            raise NotExpressibleError(
                "renorm=True (batch renormalisation) corrects training outputs with clipped r and d factors that no PyTorch or ONNX "
                "layer has; rebuild the layer with renorm=False.",
                layer=layer.name,
                setting="renorm",
                target="NormSpec",
            )
        shape = built_input_shape(layer)
        rank = len(shape)
        layout = channel_layout(layer, layer.axis, rank)
        facts = read_facts(layer, report)
        if not layer.trainable and markers.recall(layer).get("frozen") is True:
            return read_frozen(layer, facts, rank, layout)
        if not layer.trainable:
            # keras/src/layers/normalization/batch_normalization.py: `if training and self.trainable`.
            report.warn(
                "trainable=False: Keras runs this BatchNormalization in inference mode even when called with training=True "
                "(moving statistics are used and never updated); the spec records training=False."
            )
            facts = without_training(facts)
        running = recall_running(layer, report, float(layer.momentum))
        tensors = {**read_variables(layer, VARIABLES), **running.pop("tensors")}
        return facts.spec(
            layer,
            "batch",
            tensors,
            num_features=int(layer.moving_mean.shape[0]),
            spatial_rank=spatial_rank_of(layer, rank, 2),
            input_rank=rank,
            layout=layout,
            chosen_layout=chosen_layout_of(layout),
            synchronized=bool(layer.synchronized),
            track_running_stats=True,
            # Keras 3 updates moving_variance with the biased batch variance (SEMANTICS.md).
            variance_estimator="unbiased" if isinstance(layer, UnbiasedBatchNormalization) else "biased",
            scale=bool(layer.scale),
            bias=bool(layer.center),
            **running,
        )

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> Any:
        from .unbiased_batch_normalization import UnbiasedBatchNormalization

        common = self.begin_emit(spec, report)
        if not spec.track_running_stats:
            raise NotExpressibleError(
                "track_running_stats=False normalises with batch statistics at inference too, but Keras BatchNormalization always "
                "uses its moving statistics at inference; keep running statistics in the source layer.",
                layer=spec.name,
                setting="track_running_stats",
                target="keras",
            )
        if spec.frozen:
            return emit_frozen(spec, common, report)
        momentum = emit_momentum(report, spec, RUNNING_WEIGHT, options, "keras")
        warn_empty_batch(report, spec, "keras")
        axis, layout = emit_layout(spec, report)
        estimator = estimator_matches(report, spec, "biased", "keras", can_match=True, options=options)
        layer_class = (
            UnbiasedBatchNormalization if estimator == "unbiased" else import_keras().layers.BatchNormalization
        )
        if spec.synchronized:
            report.add("synchronized", True, note="batch statistics averaged across replicas in distributed training")
            if estimator == "unbiased":
                report.warn(
                    "synchronized=True with the unbiased estimator: UnbiasedBatchNormalization's n/(n-1) counts the local "
                    "replica's elements only, where the source counts every replica's."
                )
        layer = layer_class(
            axis=axis, momentum=momentum, center=spec.bias, scale=spec.scale, synchronized=spec.synchronized, **common
        )
        remember_running(layer, spec, report, momentum)
        return self.finish_emit(
            layer, spec, report, channel_build_shape(spec, report, spec.spatial_rank + 2, layout=layout), VARIABLES
        )


def emit_frozen(spec: NormSpec, common: dict, report: LayerReport, kind: str = "batch") -> Any:
    """A frozen batch spec (FrozenBatchNorm2d), or a tracked instance spec in eval, as
    BatchNormalization(trainable=False).

    keras/src/layers/normalization/batch_normalization.py: `if training and self.trainable`: a non-trainable layer
    normalises with its moving statistics in training too and never updates them, which is what frozen means.
    """
    axis, layout = emit_layout(spec, report)
    layer = import_keras().layers.BatchNormalization(axis=axis, center=spec.bias, scale=spec.scale, **common)
    layer.trainable = False
    if kind == "batch":
        report.add("frozen", True, "trainable=False", "exact", "moving statistics in training mode too, never updated")
        markers.remember(layer, frozen=True)
    return KerasBatchAdapter().finish_emit(
        layer, spec, report, channel_build_shape(spec, report, spec.spatial_rank + 2, layout=layout), VARIABLES
    )


def read_frozen(layer: Any, facts, rank: int, layout: str) -> NormSpec:
    """The frozen batch spec a BatchNormalization emitted by emit_frozen (still trainable=False) stands for."""
    return facts.spec(
        layer,
        "batch",
        read_variables(layer, VARIABLES),
        num_features=int(layer.moving_mean.shape[0]),
        spatial_rank=spatial_rank_of(layer, rank, 2),
        input_rank=rank,
        layout=layout,
        chosen_layout=chosen_layout_of(layout),
        track_running_stats=True,
        frozen=True,
        scale=bool(layer.scale),
        bias=bool(layer.center),
    )


ADAPTER = KerasBatchAdapter
