"""Moving data between channels-first and channels-last, the two layouts the frameworks use."""

from __future__ import annotations

import numpy as np


def to_channels_first(x: np.ndarray, layout: str | None) -> np.ndarray:
    """Channels-first view of `x` held in `layout` (identity for None or channels_first)."""
    if layout != "channels_last" or x.ndim < 3:
        return x
    return np.moveaxis(x, -1, 1)


def from_channels_first(x: np.ndarray, layout: str | None) -> np.ndarray:
    """`x` (channels-first) in `layout`."""
    if layout != "channels_last" or x.ndim < 3:
        return x
    return np.ascontiguousarray(np.moveaxis(x, 1, -1))
