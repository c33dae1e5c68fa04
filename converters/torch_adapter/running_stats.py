"""BatchNorm and InstanceNorm share PyTorch's _NormBase: one reader and one builder for both."""

from __future__ import annotations

import numpy as np
import torch

from schemas import LayerReport, NormSpec

from .. import markers
from ..options import ConversionOptions
from ..translate import emit_momentum, estimator_matches, record_eps, record_layout, tensor_fate
from .layouts import remember_layout, remembered_layout
from .biased_batch_norm import BIASED_CLASSES, biased_class_for
from .common import (
    SPEC_TO_TORCH,
    affine_kwargs,
    check_compute_dtype,
    extended_fields,
    finish,
    layer_name,
    read_affine,
    source,
    spec_dtype,
    to_numpy,
    write_affine,
    write_tensor,
)


def read_norm_base(module: torch.nn.Module, kind: str, spatial_rank: int, report: LayerReport) -> NormSpec:
    """NormSpec of a BatchNorm{1,2,3}d / InstanceNorm{1,2,3}d module."""
    name = layer_name(module, type(module).__name__)
    scale, bias, tensors = read_affine(module, name, report)
    tracked = bool(module.track_running_stats)
    if tracked:
        tensors["running_mean"] = to_numpy(module.running_mean)
        tensors["running_var"] = to_numpy(module.running_var)
        counter = module.num_batches_tracked
        # A counter that normbridge created for a source without one reads back as absent while still untouched.
        invented = markers.recall(module).get("invented_num_batches_tracked") and int(counter) == 0
        if counter is not None and not invented:
            tensors["num_batches_tracked"] = np.array(int(counter), dtype=np.int64)
    estimator = None
    if tracked:
        estimator = "biased" if isinstance(module, BIASED_CLASSES) else "unbiased"
    extras = markers.recall(module)
    momentum = None if module.momentum is None else float(module.momentum)
    frozen = tracked and markers.recall(module).get("frozen") is True and momentum == 0.0
    if frozen:
        # Emitted from a frozen spec (FrozenBatchNorm2d) as momentum 0: still frozen while the momentum is.
        momentum, estimator = None, None
        tensors.pop("num_batches_tracked", None)
    if not tracked and momentum is not None:
        # Without tracked statistics momentum is never used, but it is the module's setting: kept,
        # so round trips give it back.
        report.add("momentum", momentum, note="unused: statistics are not tracked; kept as given")
    dtype = spec_dtype(module, name, report)
    return NormSpec(
        **extended_fields(module, dtype),
        frozen=frozen,
        name=name,
        kind=kind,
        num_features=module.num_features,
        spatial_rank=spatial_rank,
        input_rank=extras.get("input_rank"),
        layout="channels_first",
        chosen_layout=remembered_layout(extras),
        synchronized=kind == "batch" and tracked and not frozen and extras.get("synchronized") is True,
        eps=float(module.eps),
        momentum=momentum,
        momentum_convention=None if momentum is None else "batch_weight",
        track_running_stats=tracked,
        variance_estimator=estimator,
        scale=scale,
        bias=bias,
        training=bool(module.training),
        dtype=dtype,
        source=source(module),
        tensors=tensors,
    )


def build_norm_base(spec: NormSpec, classes: dict, options: ConversionOptions, report: LayerReport) -> torch.nn.Module:
    """The PyTorch module for a batch/instance spec, state copied bit-exactly."""
    check_compute_dtype(spec)
    record_layout(report, spec, "channels_first")
    record_eps(report, spec)
    momentum = None
    if spec.frozen:
        momentum = frozen_momentum(spec, report)
    elif spec.track_running_stats:
        if spec.momentum is None:
            report.add("momentum", None, note="cumulative moving average (momentum=None)")
            momentum = None
        else:
            momentum = emit_momentum(report, spec, "batch_weight", options, "torch")
    elif spec.momentum is not None:
        momentum = spec.momentum_as("batch_weight")  # unused without tracked statistics; kept as the source gave it
        report.add(
            "momentum",
            spec.momentum,
            momentum,
            "exact" if spec.momentum_convention == "batch_weight" else "translated",
            "unused: statistics are not tracked",
        )
    cls = classes[spec.spatial_rank]
    estimator = estimator_matches(report, spec, "unbiased", "torch", can_match=spec.kind == "batch", options=options)
    if spec.track_running_stats and estimator == "biased":
        cls = biased_class_for(cls)
    module = cls(
        spec.num_features,
        eps=spec.eps,
        momentum=momentum,
        track_running_stats=spec.track_running_stats,
        dtype=SPEC_TO_TORCH[spec.dtype],
        **affine_kwargs(spec),
    )
    write_affine(module, spec, report)
    if spec.track_running_stats:
        write_tensor(module, "running_mean", spec, "running_mean")
        write_tensor(module, "running_var", spec, "running_var")
        if "num_batches_tracked" in spec.tensors:
            write_tensor(module, "num_batches_tracked", spec, "num_batches_tracked")
            report.add("num_batches_tracked", int(spec.tensors["num_batches_tracked"]), note="buffer")
        else:
            report.add(
                "num_batches_tracked",
                None,
                0,
                "stored",
                "absent in the source; set to 0 (used only when momentum=None)",
            )
            markers.remember(module, invented_num_batches_tracked=True)
    report.add("track_running_stats", spec.track_running_stats)
    tensor_fate(report, spec)
    if spec.input_rank is not None:
        markers.remember(module, input_rank=spec.input_rank)
    if spec.frozen:
        markers.remember(module, frozen=True)
    remember_layout(module, spec, report)
    if spec.synchronized:
        remember_synchronized(module, report)
    return finish(module, spec, report)


def remember_synchronized(module: torch.nn.Module, report: LayerReport) -> None:
    """A synchronized BatchNorm (Keras synchronized=True) as a stock BatchNorm that remembers it: PyTorch syncs a module
    by its class (SyncBatchNorm, which fixes no spatial rank), so the user converts it for a distributed run."""
    markers.remember(module, synchronized=True)
    report.add("synchronized", True, True, "stored", "kept on the in-memory module only (normbridge marker)")
    report.warn(
        "synchronized=True: this BatchNorm averages nothing across replicas; before distributed training wrap the model "
        "with torch.nn.SyncBatchNorm.convert_sync_batchnorm (eval and one-process training are unaffected)."
    )


def frozen_momentum(spec: NormSpec, report: LayerReport) -> float:
    """A frozen layer (FrozenBatchNorm2d) as a stock module: momentum 0, so a training step never moves the statistics.

    Eval mode is exact; a training-mode forward of the stock module still normalises with batch statistics.
    """
    report.add("frozen", True, "momentum=0.0", "approximate", "stock modules have no frozen mode; eval mode is exact")
    report.warn(
        "frozen statistics emitted as a stock module with momentum=0.0: eval mode is exact and a training step leaves the statistics "
        "unchanged, but a training-mode forward normalises with batch statistics where the frozen layer uses its running ones; keep it in eval mode."
    )
    return 0.0
