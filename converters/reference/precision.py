"""Rounding at tensor boundaries: how the reference computes a bf16/fp16 layer and its compute dtype.

Every framework accumulates a reduction in a wider type and rounds the result once, so the
reference computes each step in float64 and rounds its result to the dtype that step is stored
in: the statistics and the normalised value in the compute dtype (`compute_dtype`, else `dtype`),
each affine operation in `dtype` after a cast before it (`cast_before_affine`, LlamaRMSNorm) or in
the compute dtype otherwise (GemmaRMSNorm), and the output in `dtype`. float32 and float64 layers
without a compute dtype are computed in float64 throughout, as before schema version 2.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy: np.dtype("bfloat16"))
import numpy as np

#: Dtypes narrower than float32, whose rounding is part of what a layer computes.
NARROW = ("bfloat16", "float16")


def rounds(spec) -> bool:
    """Whether the reference rounds at tensor boundaries for `spec` (a narrow dtype or an explicit compute dtype)."""
    return spec.dtype in NARROW or spec.compute_dtype is not None


def compute_dtype(spec) -> str:
    return spec.compute_dtype or spec.dtype


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` rounded to nearest in `dtype` (ml_dtypes for bfloat16), returned as float64."""
    return np.asarray(x, dtype=np.float64).astype(dtype).astype(np.float64)


def in_compute(spec, x: np.ndarray) -> np.ndarray:
    """A statistic or normalised value as stored in the compute dtype (unchanged when the spec does not round)."""
    return round_to(x, compute_dtype(spec)) if rounds(spec) else x


def affine_dtype(spec) -> str:
    """The dtype scale and bias are applied in."""
    return spec.dtype if spec.cast_before_affine else compute_dtype(spec)
