"""Rule shared by the trailing-axes kinds (layer, rms)."""

from __future__ import annotations

from ..errors import SpecError


def check_normalized_shape(spec) -> None:
    """A non-empty tuple of positive dims, fewer than the input rank when that is known."""
    shape = spec.normalized_shape
    if len(shape) == 0 or any(d < 1 for d in shape):
        raise SpecError(f"normalized_shape must be non-empty positive dims (got {shape}).", layer=spec.name, setting="normalized_shape")
    if spec.input_rank is not None and spec.input_rank <= len(shape):
        raise SpecError(
            f"input_rank {spec.input_rank} leaves no batch axis before normalized_shape {shape}.", layer=spec.name, setting="input_rank"
        )
