"""Shapes and axes of Keras normalization layers.

Keras keeps the input rank only in the build config; the channel axis and the normalised
axes are constructor arguments that must be the ones PyTorch and ONNX know.
"""

from __future__ import annotations

import numbers
from typing import Any

from schemas import LayerReport, NormSpec, SpecError, UnsupportedObjectError


def built_input_shape(layer: Any) -> tuple[int | None, ...]:
    """The input shape the layer was built for; SpecError when it is not built."""
    if not layer.built:
        raise SpecError(
            f"the {type(layer).__name__} is not built, so its input rank and weights do not exist yet; call it on an input or build(input_shape) first.",
            layer=layer.name,
            setting="input_shape",
        )
    shape = (layer.get_build_config() or {}).get("input_shape")
    if not isinstance(shape, (tuple, list)) or not all(d is None or isinstance(d, numbers.Integral) for d in shape):
        raise SpecError(
            f"the {type(layer).__name__} is built but records no single input shape (got {shape!r}); build it with build(input_shape).",
            layer=layer.name,
            setting="input_shape",
        )
    return tuple(None if d is None else int(d) for d in shape)


def channel_layout(layer: Any, axis: Any, rank: int) -> str:
    """channels_last for axis -1, channels_first for axis 1; anything else is not a per-channel normalizer."""
    if isinstance(axis, numbers.Integral) and not isinstance(axis, bool):
        if axis in (-1, rank - 1):  # checked first: for rank 2 both layouts are the same
            return "channels_last"
        if axis in (1, 1 - rank):
            return "channels_first"
    raise UnsupportedObjectError(
        f"the {type(layer).__name__} normalises axis {axis!r} of a rank-{rank} input, expected the channel axis -1 (channels_last) or 1 (channels_first); "
        "rebuild it with one of those.",
        layer=layer.name,
        setting="axis",
    )


def trailing_axes(layer: Any, axis: Any, rank: int) -> tuple[int, ...]:
    """The normalised axes as negative indices; UnsupportedObjectError unless they are the trailing ones."""
    axes = [axis] if isinstance(axis, numbers.Integral) else list(axis)
    negative = sorted(int(a) - rank if int(a) >= 0 else int(a) for a in axes)
    if not negative or negative != list(range(-len(negative), 0)):
        raise UnsupportedObjectError(
            f"the {type(layer).__name__} normalises axes {axis!r} of a rank-{rank} input, expected the trailing contiguous axes (e.g. [-2, -1]); "
            "PyTorch and ONNX normalise trailing axes only, so transpose the input first.",
            layer=layer.name,
            setting="axis",
        )
    return tuple(negative)


def normalises_channel_axis(axis: Any, rank: int) -> bool:
    """A LayerNormalization/RMSNormalization over axis 1 alone of a rank >= 3 input:
    ConvNeXt's channels_first layer norm."""
    axes = [axis] if isinstance(axis, numbers.Integral) else list(axis)
    return rank >= 3 and len(axes) == 1 and int(axes[0]) in (1, 1 - rank)


def channels_first_shape(num_features: int, rank: int) -> tuple[int | None, ...]:
    return (None, num_features) + (None,) * (rank - 2)


def trailing_axis_argument(count: int) -> int | list[int]:
    """Keras `axis=` for the last `count` axes: -1, or [-count, ..., -1]."""
    return -1 if count == 1 else list(range(-count, 0))


def channels_last_shape(num_features: int, rank: int) -> tuple[int | None, ...]:
    return (None,) * (rank - 1) + (num_features,)


def channel_shape(num_features: int, rank: int, layout: str) -> tuple[int | None, ...]:
    """The build shape of a channel kind in `layout`."""
    return (
        channels_first_shape(num_features, rank)
        if layout == "channels_first"
        else channels_last_shape(num_features, rank)
    )


def trailing_shape(normalized_shape: tuple[int, ...], rank: int) -> tuple[int | None, ...]:
    return (None,) * (rank - len(normalized_shape)) + tuple(normalized_shape)


#: Why a Keras layer has one input rank, said in every report that picks one.
FIXED_RANK = (
    "a built Keras layer takes one input rank (its InputSpec fixes ndim, and BatchNormalization fixes its "
    "reduction axes in build)"
)
#: Why the rank a trailing-axes layer is built for does not restrict it.
ANY_RANK = (
    "built for this rank, but a Keras LayerNormalization or RMSNormalization over trailing axes fixes no input rank "
    "(its build records only the normalised axes' sizes): it takes inputs of any rank >= the normalised axes + 1"
)


def build_rank(spec: NormSpec, report: LayerReport, default: int, minimum: int = 2, fixes_rank: bool = True) -> int:
    """spec.input_rank (the source's, or `input_rank=` of the conversion), or `default` (reported) when there is none.

    Keras layers are built for the rank given; only without one is the kind's usual rank used, and the
    report says so, with how to choose another. `fixes_rank=False` (trailing-axes layer and RMS norms) says instead
    that the rank built for does not restrict the layer's inputs.
    """
    if spec.input_rank is not None and spec.input_rank >= minimum:
        report.add("input_rank", spec.input_rank, note=FIXED_RANK if fixes_rank else ANY_RANK)
        return spec.input_rank
    if not fixes_rank:
        report.add("input_rank", spec.input_rank, default, "translated", f"not recorded by the source; {ANY_RANK}")
        return default
    reason = (
        "not recorded by the source" if spec.input_rank is None else f"rank {spec.input_rank} has no batch axis here"
    )
    report.add(
        "input_rank",
        spec.input_rank,
        default,
        "translated",
        f"{reason}; {FIXED_RANK}, so it is built for rank-{default} inputs: pass input_rank= to build it for another rank",
    )
    return default


def spatial_rank_of(layer: Any, rank: int, min_rank: int) -> int:
    """Spatial axes of a channel kind: 1 to 3, as PyTorch's 1d/2d/3d (a rank-2 BatchNorm input counts as 1d)."""
    if not min_rank <= rank <= 5:
        raise UnsupportedObjectError(
            f"the {type(layer).__name__} was built for a rank-{rank} input, expected rank {min_rank} to 5 (batch, channels and up to 3 spatial axes).",
            layer=layer.name,
            setting="input_rank",
        )
    return max(rank - 2, 1)
