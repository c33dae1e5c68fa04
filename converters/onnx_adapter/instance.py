"""InstanceNorm <-> InstanceNormalization, or an eval-mode BatchNormalization when statistics are tracked.

InstanceNormalization has no running statistics. A tracked PyTorch InstanceNorm at
eval normalises with its running statistics, which is exactly an eval-mode
BatchNormalization; metadata kind "instance" tells the two apart on reading.
"""

from __future__ import annotations

from schemas import LayerReport, NormSpec, NotExpressibleError
from schemas.kinds import KIND_INFO

from ..adapter import KindAdapter
from ..options import ConversionOptions
from . import metadata, reading
from .batch import emit_batch_norm, read_batch_norm
from .layer_graph import INPUT, LayerGraph, op_version

OP = KIND_INFO["instance"].onnx_op


def read_instance_norm(layer: reading.OnnxLayer, report: LayerReport) -> NormSpec:
    """A spec from an InstanceNormalization node (never tracked)."""
    meta = layer.metadata(report)
    fields = reading.common_fields(layer, report, meta)
    scale, bias = layer.tensor(1, "scale"), layer.tensor(2, "bias")
    eps, eps_origin = metadata.eps(report, meta, layer.attribute("epsilon", reading.default_eps(layer)))
    momentum, convention = metadata.untracked_momentum(report, meta, None)  # InstanceNormalization has none
    fields.update(
        kind="instance",
        momentum=momentum,
        momentum_convention=convention,
        num_features=layer.channels(scale),
        spatial_rank=layer.spatial_rank(report, meta),
        layout="channels_first",
        eps=eps,
        eps_origin=eps_origin,
        track_running_stats=metadata.trusted(
            report, meta, "track_running_stats", False, not meta.get("track_running_stats")
        ),
        scale=metadata.affine_flag(report, meta, "scale", scale, 1.0),
        bias=metadata.affine_flag(report, meta, "bias", bias, 0.0),
    )
    return reading.build(
        fields, {"scale": scale if fields["scale"] else None, "bias": bias if fields["bias"] else None}
    )


class OnnxInstanceNorm(KindAdapter):
    """instance <-> InstanceNormalization (untracked) or BatchNormalization (tracked, eval)."""

    framework = "onnx"
    kind = "instance"
    holds = frozenset({"dtype"})

    def to_spec(self, obj, report: LayerReport) -> NormSpec:
        layer = reading.parse(obj, self.kind)
        if layer.node.op_type == OP:
            return read_instance_norm(layer, report)
        return read_batch_norm(layer, report)

    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport):
        if spec.track_running_stats and not spec.training:
            report.warn(
                "tracked InstanceNorm emitted as an eval-mode BatchNormalization with its running statistics: eval outputs are identical, "
                "but training differs (ONNX has no per-instance training with running statistics) and run_train_step refuses it."
            )
            return emit_batch_norm(spec, options, report, training=False)
        if spec.track_running_stats:
            if not options.onnx_training_mode:
                raise NotExpressibleError(
                    "a tracked InstanceNorm in training mode normalises per instance and updates running statistics, which no ONNX op does; "
                    "put the layer in eval mode, or pass onnx_training_mode=True to emit InstanceNormalization without running statistics.",
                    layer=spec.name,
                    setting="training",
                    target="onnx",
                )
            for name in ("running_mean", "running_var"):
                report.add(
                    name,
                    f"{spec.tensors[name].dtype}{list(spec.tensors[name].shape)}",
                    None,
                    "dropped",
                    "InstanceNormalization has no running statistics",
                )
            report.warn(
                "emitted InstanceNormalization for training mode: outputs match, but the running statistics are neither carried nor updated."
            )
        g = LayerGraph(spec, options, report)
        if spec.momentum is not None and not spec.track_running_stats:
            report.add(
                "momentum",
                spec.momentum,
                spec.momentum,
                "stored",
                f"unused: statistics are not tracked; InstanceNormalization has none, kept in metadata '{metadata.KEY}'",
            )
        scale, bias = g.affine()
        result = g.instance_norm(INPUT, scale, bias)
        return g.finish(result, f"{OP}-{op_version(OP, g.opset)}", native=True)


ADAPTER = OnnxInstanceNorm
