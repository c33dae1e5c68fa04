"""Rules shared by the kinds: which fields must be set or absent, tensor shapes and values.

`check_fields` and `check_tensors` apply what a kind's KindInfo says; a kind's own `validate`
adds the rules only it has between the two.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import SpecError


def require(spec, *fields: str) -> None:
    """Each field must be set for this kind."""
    for field in fields:
        if getattr(spec, field) is None:
            raise SpecError(f"a {spec.kind} normalizer needs '{field}' (got None).", layer=spec.name, setting=field)


def forbid(spec, *fields: str) -> None:
    """Each field must be unset for this kind: it has no meaning there."""
    for field in fields:
        if getattr(spec, field) is not None:
            raise SpecError(
                f"'{field}' has no meaning for a {spec.kind} normalizer (got {getattr(spec, field)!r}); leave it None.",
                layer=spec.name,
                setting=field,
            )


def forbid_running_stats(spec) -> None:
    """Kinds without running statistics: no tracking, no momentum, no estimator, nothing frozen."""
    if spec.frozen:
        raise SpecError(
            f"a {spec.kind} normalizer has no running statistics to freeze; set frozen=False.",
            layer=spec.name,
            setting="frozen",
        )
    if spec.track_running_stats:
        raise SpecError(
            f"a {spec.kind} normalizer has no running statistics; set track_running_stats=False.",
            layer=spec.name,
            setting="track_running_stats",
        )
    forbid(spec, "momentum", "momentum_convention", "variance_estimator")


def require_running_stats_fields(spec) -> None:
    """Tracked statistics need an estimator; momentum None means cumulative average and needs a counter.

    Without tracked statistics the estimator is never used, so it must be None; the momentum is never
    used either but may be kept as the source gave it (torch's InstanceNorm2d(momentum=0.3)), so that
    round trips give it back; frozen
    statistics (FrozenBatchNorm2d) are never updated, so they have neither, nor a batch counter.
    """
    if spec.frozen:
        if not spec.track_running_stats:
            raise SpecError(
                "frozen statistics are running statistics; set track_running_stats=True.",
                layer=spec.name,
                setting="frozen",
            )
        forbid(spec, "momentum", "momentum_convention", "variance_estimator")
        if "num_batches_tracked" in spec.tensors:
            raise SpecError(
                "frozen statistics count no batches; drop num_batches_tracked.",
                layer=spec.name,
                setting="num_batches_tracked",
            )
        return
    if not spec.track_running_stats:
        forbid(spec, "variance_estimator")
        return
    require(spec, "variance_estimator")
    if spec.momentum is None and "num_batches_tracked" not in spec.tensors:
        raise SpecError(
            "momentum=None (cumulative average) needs the num_batches_tracked tensor.",
            layer=spec.name,
            setting="momentum",
        )


def check_normalized_shape(spec) -> None:
    """A non-empty tuple of positive dims, at most as many as the input rank when that is known (the trailing kinds).

    With a layout the kind normalises over the channel axis alone, so normalized_shape is (C,), and
    only channels_first says something the trailing form cannot (channels_last is the trailing form).
    """
    shape = spec.normalized_shape
    if len(shape) == 0 or any(d < 1 for d in shape):
        raise SpecError(
            f"normalized_shape must be non-empty positive dims (got {shape}).",
            layer=spec.name,
            setting="normalized_shape",
        )
    if spec.layout == "channels_last":
        raise SpecError(
            "a trailing kind over the last axis needs no layout; leave layout None (channels_first means over axis 1).",
            layer=spec.name,
            setting="layout",
        )
    if spec.layout is not None and len(shape) != 1:
        raise SpecError(
            f"over the channel axis normalized_shape is (C,) (got {shape}).",
            layer=spec.name,
            setting="normalized_shape",
        )
    # input_rank == len(shape) normalises every axis (torch on an unbatched input, ONNX axis=0): allowed.
    if spec.input_rank is not None and spec.input_rank < len(shape):
        raise SpecError(
            f"input_rank {spec.input_rank} is smaller than normalized_shape {shape} has axes.",
            layer=spec.name,
            setting="input_rank",
        )


def check_fields(info, spec) -> None:
    """The kind's required and forbidden fields, and its running-statistics rule (KindInfo `info`)."""
    require(spec, *info.required)
    forbid(spec, *info.forbidden)
    if info.running_stats:
        require_running_stats_fields(spec)
    else:
        forbid_running_stats(spec)


def check_tensors(info, spec) -> None:
    """normalized_shape (trailing kinds), then the state tensors against the kind's per-feature shape."""
    if info.trailing:
        check_normalized_shape(spec)
    expect_tensor_shapes(spec, info.per_feature_shape(spec))


def expect_tensor_shapes(spec, per_feature_shape: tuple[int, ...]) -> None:
    """scale/bias follow the affine flags; running stats follow tracking; shapes match the features."""
    wanted = {
        "scale": spec.scale,
        "bias": spec.bias,
        "running_mean": spec.track_running_stats,
        "running_var": spec.track_running_stats,
    }
    for name, present in wanted.items():
        if present and name not in spec.tensors:
            raise SpecError(f"tensor '{name}' is missing although the spec needs it.", layer=spec.name, setting=name)
        if not present and name in spec.tensors:
            raise SpecError(
                f"tensor '{name}' is present although the spec's flags exclude it; drop it or set the flag.",
                layer=spec.name,
                setting=name,
            )
        if present and tuple(spec.tensors[name].shape) != per_feature_shape:
            raise SpecError(
                f"tensor '{name}' has shape {tuple(spec.tensors[name].shape)}, expected {per_feature_shape}.",
                layer=spec.name,
                setting=name,
            )


def check_common_tensors(spec) -> None:
    """dtype, finiteness and sign of every tensor."""
    for name, array in spec.tensors.items():
        if name == "num_batches_tracked":
            if array.shape != () or array.dtype != np.int64 or int(array) < 0:
                raise SpecError(
                    f"num_batches_tracked must be a non-negative int64 scalar (got dtype {array.dtype}, shape {array.shape}).",
                    layer=spec.name,
                    setting=name,
                )
            continue
        if _dtype_name(array.dtype) != (spec.state_dtype or spec.dtype):
            expected = (
                f"the spec's state_dtype {spec.state_dtype}" if spec.state_dtype else f"the spec dtype {spec.dtype}"
            )
            raise SpecError(
                f"tensor '{name}' has dtype {array.dtype}, expected {expected}.", layer=spec.name, setting=name
            )
        if not np.isfinite(array).all():
            raise SpecError(
                f"tensor '{name}' holds NaN or Inf values; the layer's state is corrupt.", layer=spec.name, setting=name
            )
    if "running_var" in spec.tensors and (spec.tensors["running_var"] < 0).any():
        raise SpecError(
            "running_var holds negative values; a variance cannot be negative.", layer=spec.name, setting="running_var"
        )
    if "num_batches_tracked" in spec.tensors and not spec.track_running_stats:
        raise SpecError(
            "num_batches_tracked is present but statistics are not tracked.",
            layer=spec.name,
            setting="num_batches_tracked",
        )


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype: np.dtype) -> str:
    """str(dtype), remembered (NumPy computes a dtype's name in Python on every call; every spec checks every
    tensor's)."""
    return str(dtype)
