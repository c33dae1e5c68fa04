"""Exact handling of the two scalars every converter gets wrong: eps and momentum.

ONNX stores attributes as float32, so `1e-5` comes back as 9.99999974737875e-06.
The value a user wrote is the shortest decimal that rounds to that float32, and that
is what we recover. Momentum conventions are complements (`m` versus `1 - m`);
in binary floating point `1 - (1 - 0.1)` is 0.09999999999999998, so the complement
is taken on the decimal the user wrote, where it is exact and reversible.
"""

from __future__ import annotations

from decimal import Decimal
from functools import lru_cache

import numpy as np


def as_float32(value: float) -> float:
    """The float64 value of the float32 nearest to `value` (what ONNX stores)."""
    return float(np.float32(value))


def shortest_float32_decimal(stored: float) -> float:
    """The shortest decimal that rounds to the float32 `stored`, as a Python float.

    `shortest_float32_decimal(float(np.float32(1e-5))) == 1e-05`.
    """
    text = np.format_float_scientific(np.float32(stored), unique=True, trim="-")
    return float(text)


def recover_from_float32(stored: float, hint: float | None = None) -> float:
    """Recover the float64 a float32 attribute came from.

    A `hint` (for example the exact value normbridge wrote into ONNX metadata) wins
    when it rounds to the same float32, because then it is provably consistent with
    the graph; otherwise the shortest decimal is the best guess.
    """
    if hint is not None and np.float32(hint) == np.float32(stored):
        return float(hint)
    return shortest_float32_decimal(stored)


@lru_cache(
    maxsize=4096
)  # a pure function of one float, asked for every momentum of every spec compared, read and written
def decimal_complement(value: float) -> float:
    """`1 - value`, computed on the shortest decimal of `value` so it round-trips.

    `decimal_complement(decimal_complement(0.1)) == 0.1`, unlike `1 - (1 - 0.1)`.
    """
    value = float(value)
    exact = float(Decimal(1) - Decimal(repr(value)))
    # Among the floats next to the exact complement, prefer the shortest one whose own
    # complement gives `value` back, so that a value read from the other convention
    # returns to what the user wrote (0.9 -> 0.1, not 0.09999999999999998).
    candidates = [exact]
    below = above = exact
    for _ in range(4):
        below, above = float(np.nextafter(below, -np.inf)), float(np.nextafter(above, np.inf))
        candidates += [below, above]
    returning = [c for c in candidates if float(Decimal(1) - Decimal(repr(c))) == value]
    if not returning:
        return exact
    return min(returning, key=lambda c: (len(repr(c)), abs(c - exact)))


def dtype_default_eps(dtype: str) -> float:
    """The eps PyTorch's RMSNorm uses when given eps=None, for a layer of `dtype` ("float16", "bfloat16", ...).

    Not finfo(dtype).eps, as its docs say: torch computes the norm in its computation dtype (float32 for float16,
    bfloat16 and float32; float64 for float64) and takes that type's eps (aten's `opmath_type` epsilon and
    torch._decomp's `_fused_rms_norm`). A float16 RMSNorm(eps=None) adds 1.19e-07, not float16's 9.77e-04."""
    return float(np.finfo(np.float64 if dtype == "float64" else np.float32).eps)


def is_float_dtype(dtype: np.dtype) -> bool:
    """A floating dtype, bfloat16 included: ml_dtypes' bfloat16 is a float NumPy lists as kind 'V', not 'f'."""
    return dtype.kind == "f" or dtype.name == "bfloat16"
