"""BatchNorm <-> BatchNormalization (BatchNormalization-9/14/15 by opset).

ONNX's momentum is the running_weight one (running = m * running + (1 - m) * batch)
and its training step uses the biased batch variance. A train-mode node normalises
with batch statistics, which in a serving graph makes every output depend on the
rest of the batch: it is emitted only on request (options.onnx_training_mode).
"""

from __future__ import annotations

import numpy as np

from schemas import LayerReport, NormSpec, NotExpressibleError
from schemas.floats import as_float32

from schemas.kinds import KIND_INFO

from ..adapter import KindAdapter
from ..options import ConversionOptions
from ..translate import emit_momentum, estimator_matches, warn_empty_batch
from . import metadata, reading
from .layer_graph import INPUT, OUTPUT, LayerGraph, op_version

INFO = KIND_INFO["batch"]
OP = INFO.onnx_op
#: training_mode exists from BatchNormalization-14.
TRAINING_MODE_VERSION = 14


def emit_batch_norm(spec: NormSpec, options: ConversionOptions, report: LayerReport, *, training: bool):
    """A BatchNormalization graph for `spec`; zero/one running inputs when statistics are not tracked.

    In training mode the node must have three outputs (onnxruntime refuses fewer): tracked
    statistics are graph outputs "running_mean"/"running_var", untracked ones graph outputs that
    nothing needs (onnxruntime computes Y wrongly when they are not graph outputs).
    """
    g = LayerGraph(spec, options, report)
    version = op_version(OP, g.opset)
    if training and version < TRAINING_MODE_VERSION:
        raise NotExpressibleError(
            f"training_mode needs {OP}-{TRAINING_MODE_VERSION} but opset {g.opset} gives {OP}-{version}; pass opset >= {TRAINING_MODE_VERSION}.",
            layer=spec.name,
            setting="opset",
            target="onnx",
        )
    inputs = [INPUT, *g.affine()]
    if spec.track_running_stats:
        inputs += [g.state("running_mean"), g.state("running_var")]
    else:
        inputs += [
            g.tensor("running_mean", np.zeros(spec.num_features, spec.dtype)),
            g.tensor("running_var", np.ones(spec.num_features, spec.dtype)),
        ]
    attributes = {"epsilon": g.eps}
    if spec.frozen:
        report.add(
            "frozen",
            True,
            "training_mode=0",
            "exact",
            f"an eval-mode node never updates its statistics; kept in metadata '{metadata.KEY}'",
        )
    momentum = None if spec.frozen else emit_momentum(report, spec, "running_weight", options, "onnx")
    if momentum is not None:
        attributes["momentum"] = momentum
        if spec.dtype == "float64" and as_float32(momentum) != momentum:
            report.warn(
                f"ONNX stores momentum as float32 ({as_float32(momentum)!r}): a float64 training step moves the running statistics "
                f"by up to {abs(as_float32(momentum) - momentum):.1e} x |batch statistic - running statistic| differently; eval is unaffected."
            )
    outputs = [OUTPUT]
    if training:
        attributes["training_mode"] = 1
        if spec.track_running_stats:
            outputs += ["running_mean", "running_var"]
            for name in outputs[1:]:
                g.output(name, [spec.num_features])
        else:
            # Declared as graph outputs too: onnxruntime 1.32 normalises with wrong statistics when they are not
            # (checked).
            outputs += [f"{spec.name}.running_mean_unused", f"{spec.name}.running_var_unused"]
            for name in outputs[1:]:
                g.output(name, [spec.num_features])
    g.node(OP, inputs, outputs, **attributes)
    return g.finish(OUTPUT, f"{OP}-{version}", native=True)


def read_batch_norm(layer: reading.OnnxLayer, report: LayerReport):
    """A spec from a BatchNormalization node (kind batch, or a tracked instance normbridge emitted)."""
    meta = layer.metadata(report)
    fields = reading.common_fields(layer, report, meta)
    scale, bias, mean, var = (layer.tensor(i, name) for i, name in enumerate(INFO.onnx_inputs, start=1))
    graph_training = layer.attribute("training_mode", 0) == 1
    # An untracked BatchNorm is emitted as training_mode=1 over zero/one running inputs.
    untracked_form = graph_training and bool(np.all(mean == 0) and np.all(var == 1))
    tracked = metadata.trusted(
        report, meta, "track_running_stats", True, meta.get("track_running_stats", True) or untracked_form
    )
    count = metadata.num_batches_tracked(report, meta) if tracked else None
    # Untracked, both modes compute batch statistics: the mode is the metadata's to tell.
    training = metadata.trusted(
        report, meta, "training", graph_training, not tracked or meta.get("training") == graph_training
    )
    # Untracked statistics never use the momentum: only the metadata's (the source's setting) is kept.
    frozen = tracked and not graph_training and meta.get("frozen") is True and layer.attribute("momentum") is None
    if tracked and not frozen:
        momentum, convention = metadata.momentum(report, meta, layer.attribute("momentum"), count)
    elif tracked:
        momentum, convention = None, None
    else:
        momentum, convention = metadata.untracked_momentum(report, meta, layer.attribute("momentum"))
    eps, eps_origin = metadata.eps(report, meta, layer.attribute("epsilon", reading.default_eps(layer)))
    spatial = layer.spatial_rank(report, meta)
    fields.update(
        kind=layer.kind,
        num_features=layer.channels(mean),
        spatial_rank=spatial,
        layout="channels_first",
        eps=eps,
        eps_origin=eps_origin,
        momentum=momentum,
        momentum_convention=convention if momentum is not None else None,
        track_running_stats=tracked,
        variance_estimator="biased" if tracked and not frozen else None,
        training=training,
        frozen=frozen,
        synchronized=tracked and not frozen and layer.kind == "batch" and meta.get("synchronized") is True,
        scale=metadata.affine_flag(report, meta, "scale", scale, 1.0),
        bias=metadata.affine_flag(report, meta, "bias", bias, 0.0),
    )
    tensors = {"scale": scale if fields["scale"] else None, "bias": bias if fields["bias"] else None}
    if tracked:
        tensors.update(running_mean=mean, running_var=var)
        if count is not None:
            tensors["num_batches_tracked"] = np.array(count, dtype=np.int64)
    return reading.build(fields, tensors)


class OnnxBatchNorm(KindAdapter):
    """batch <-> BatchNormalization."""

    framework = "onnx"
    kind = "batch"
    #: bfloat16 tensors; frozen statistics: an eval-mode node (training_mode=0), which never updates them. synchronized:
    #: a graph runs on one device, where a synchronized step computes what an unsynchronized one does;
    #: kept in the metadata for the way back.
    holds = frozenset({"dtype", "frozen", "synchronized"})

    def to_spec(self, obj, report: LayerReport) -> NormSpec:
        return read_batch_norm(reading.parse(obj, self.kind), report)

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport):
        if not spec.track_running_stats:
            if not options.onnx_training_mode:
                raise NotExpressibleError(
                    "track_running_stats=False normalises with batch statistics even at inference, which ONNX can express only as a "
                    "training_mode=1 BatchNormalization whose outputs depend on the rest of the batch; pass onnx_training_mode=True to emit that.",
                    layer=spec.name,
                    setting="track_running_stats",
                    target="onnx",
                )
            report.add(
                "track_running_stats",
                False,
                "training_mode=1",
                "translated",
                "batch statistics always, zero/one running inputs",
            )
            report.warn(
                "emitted training_mode=1 (batch statistics at inference, as the source computes): each output depends on the other samples in its batch."
            )
            return emit_batch_norm(spec, options, report, training=True)
        if spec.training and not options.onnx_training_mode:
            raise NotExpressibleError(
                "the layer is in training mode, and a train-mode BatchNormalization in a serving graph normalises with batch statistics, "
                "so each request's output depends on the others in its batch; put the layer in eval mode, or pass onnx_training_mode=True to emit training_mode=1.",
                layer=spec.name,
                setting="training",
                target="onnx",
            )
        estimator_matches(report, spec, "biased", "onnx", can_match=False, options=options)
        warn_empty_batch(report, spec, "onnx")
        if spec.synchronized:
            report.add(
                "synchronized",
                True,
                True,
                "stored",
                f"in the '{metadata.KEY}' metadata: an ONNX graph runs on one device",
            )
            if spec.training:
                report.warn(
                    "synchronized=True: the training_mode=1 node normalises with this batch's statistics alone; "
                    "nothing averages them across replicas."
                )
        if spec.training:
            report.add("training", True, "training_mode=1", "translated", "outputs running_mean and running_var")
            report.warn(
                "emitted training_mode=1: the graph normalises with batch statistics, so each output depends on the other samples in its batch."
            )
        return emit_batch_norm(spec, options, report, training=spec.training)


ADAPTER = OnnxBatchNorm
