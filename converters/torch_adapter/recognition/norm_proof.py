"""Proving a derived spec: run the module on a probe and compare with the NumPy reference.

A spec read from a module's ops is accepted only when the module's output on a random probe
matches `converters/reference/` for that spec. Half the probe's samples are scaled so that
their mean square is about eps: there eps moves the output by tens of percent, so a misread eps
(which ordinary inputs cannot reveal, see SEMANTICS.md) fails the proof too.

`expected` expresses the schema-version-2 settings (scale_offset, a channels_first layer/rms,
frozen statistics) through the version-1 reference: the offset folded into the scale in float64,
the channel axis moved last, frozen statistics read as eval. It computes in float64 throughout,
which is why narrow dtypes get a wider tolerance.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401  (NumPy's bfloat16)
import numpy as np

from schemas import NormSpec

from ... import reference

#: Relative tolerance of a proof per layer dtype: float64 reference against the module's rounding.
TOLERANCE = {"float64": 1e-9, "float32": 2e-5, "float16": 1e-2, "bfloat16": 4e-2}


def probe_input(shape: tuple[int, ...], eps: float, seed: int = 0) -> np.ndarray:
    """A float64 probe of `shape`: N(0, 1) samples, and every odd sample scaled to a mean square near eps."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if shape[0] > 1:
        x[1::2] *= np.sqrt(eps)
    return x


def expected(spec: NormSpec, x: np.ndarray) -> np.ndarray:
    """The reference output of `spec` on `x` (channels-first for the channel kinds), eval mode."""
    plain = spec
    changes: dict = {"compute_dtype": None, "cast_before_affine": False, "dtype": "float64"}
    tensors = {k: np.asarray(v, dtype=np.float64) for k, v in spec.tensors.items() if k != "num_batches_tracked"}
    if "num_batches_tracked" in spec.tensors:
        tensors["num_batches_tracked"] = spec.tensors["num_batches_tracked"]
    if spec.scale_offset:
        tensors["scale"] = tensors["scale"] + spec.scale_offset
        changes["scale_offset"] = 0.0
    if spec.frozen:
        changes.update(frozen=False, variance_estimator="unbiased", momentum=0.1, momentum_convention="batch_weight")
    moved = spec.kind in ("layer", "rms") and spec.layout is not None
    if moved:
        changes["layout"] = None
    plain = spec.replace(tensors=tensors, training=False, **changes)
    if moved:
        return np.moveaxis(reference.forward(plain, np.moveaxis(x, 1, -1), False), -1, 1)
    return reference.forward(plain, x, False)


def disagreement(spec: NormSpec, x: np.ndarray, y: np.ndarray) -> str | None:
    """None when the module's output `y` on `x` is the reference's for `spec`, else how they differ."""
    want = expected(spec, x)
    got = np.asarray(y, dtype=np.float64)
    if got.shape != want.shape:
        return f"the output has shape {got.shape}, the reference {want.shape}"
    if not np.all(np.isfinite(got)):
        return "the output is not finite on the probe"
    tolerance = TOLERANCE[spec.dtype]
    scale = max(1.0, float(np.max(np.abs(want))))
    error = float(np.max(np.abs(got - want)))
    if error > tolerance * scale:
        return (
            f"its output differs from the reference by {error:.3g} (tolerance {tolerance * scale:.3g} for {spec.dtype})"
        )
    return None


def as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` rounded to `dtype` and back to float64: the probe values the module actually sees."""
    return np.asarray(x, dtype=np.float64).astype(dtype).astype(np.float64)
