"""What a target's stock layer can compute of a spec that uses settings it does not hold, and what it loses.

Two settings of real models are not attributes of any stock class, but their eval function is one a stock
class computes, exactly or within one rounding of a narrow dtype:

- `scale_offset` (GemmaRMSNorm's `x * (1 + w)`): the stock scale is `scale_offset + w`, computed in the dtype
  the source applies its affine in. For a float32 or float64 layer, or one that casts before its affine, that
  is the very number the source multiplies by, so the conversion is exact in eval mode. For a bfloat16 or
  float16 layer whose affine runs in float32 (Gemma in bf16), the stock scale is stored in the layer's dtype:
  `1 + w` is rounded to it, the factor moves by at most half an ulp of that dtype, and the report says so.
  What is not kept: the parameter is `1 + w`, not `w` (an optimizer's weight decay pulls it toward 0, not 1).
- `cast_before_affine` (LlamaRMSNorm and T5LayerNorm in bf16/fp16: `w * h.to(dtype)`): every stock class
  with float32 statistics applies the scale in float32 and casts once at the end, so the output differs by at
  most one rounding to the layer's dtype (half an ulp), which the report states.

Everything else an adapter does not hold is still refused by `api.refuse_unheld_settings`, naming the layer
and the setting: this module only turns what a stock class computes into the spec it holds.
"""

from __future__ import annotations

import numpy as np

from schemas import LayerReport, NormSpec

from .reference.precision import affine_dtype

#: The settings this module can express for an adapter that does not hold them.
EXPRESSIBLE = ("scale_offset", "cast_before_affine")


def stock_spec(spec: NormSpec, holds: frozenset[str], report: LayerReport | None = None) -> NormSpec:
    """`spec` as a stock layer holding only `holds` computes it: a scale offset folded into the scale, a cast before the
    affine moved after it; each recorded in `report`. Unchanged when the adapter holds them
    (or the spec uses neither)."""
    if spec.scale_offset and "scale_offset" not in holds:
        spec = _fold_scale_offset(spec, report)
    if spec.cast_before_affine and "cast_before_affine" not in holds:
        spec = _cast_after_affine(spec, report)
    return spec


def _fold_scale_offset(spec: NormSpec, report: LayerReport | None) -> NormSpec:
    """scale_offset + scale as the plain scale, computed in the dtype the source adds them in,
    stored in the layer's dtype."""
    where = affine_dtype(spec)
    factor = (np.asarray(spec.tensors["scale"]).astype(where) + np.asarray(spec.scale_offset, dtype=where)).astype(
        spec.dtype
    )
    exact = where == spec.dtype
    if report is not None:
        note = (
            f"the stock scale is {spec.scale_offset:g} + scale, computed in {where} as the source computes it: the same "
            "factor, exact in eval mode"
        )
        if not exact:
            note = (
                f"the stock scale is {spec.scale_offset:g} + scale computed in {where} and stored in {spec.dtype}, where the "
                f"source keeps it in {where}: the factor moves by at most half a {spec.dtype} ulp"
            )
        report.add("scale_offset", spec.scale_offset, 0.0, "translated" if exact else "approximate", note)
        report.warn(
            f"scale_offset={spec.scale_offset:g} is folded into the scale: the converted layer's parameter is "
            f"{spec.scale_offset:g} + w, not w (weight decay pulls it toward 0, not {spec.scale_offset:g})"
            + ("" if exact else f"; {spec.dtype} rounding of {spec.scale_offset:g} + w is not kept exact")
        )
    tensors = dict(spec.tensors)
    tensors["scale"] = factor
    return spec.replace(scale_offset=0.0, tensors=tensors)


def _cast_after_affine(spec: NormSpec, report: LayerReport | None) -> NormSpec:
    """The cast back to the layer's dtype after the affine instead of before it: one rounding moves."""
    if report is not None:
        report.add(
            "cast_before_affine",
            True,
            False,
            "approximate",
            f"the target applies scale and bias in {spec.compute_dtype} and casts to {spec.dtype} once, the source casts "
            f"before them: outputs differ by at most one {spec.dtype} rounding (half an ulp)",
        )
        report.warn(
            f"the cast to {spec.dtype} before the affine is not kept: the target casts after it, so outputs can differ "
            f"by one {spec.dtype} rounding"
        )
    return spec.replace(cast_before_affine=False)


__all__ = ["EXPRESSIBLE", "stock_spec"]
