"""The spec normbridge writes into `model.metadata_props`, trusted field by field.

ONNX cannot hold everything a spec says: attributes are float32, there is no layer
name, no train/eval flag outside BatchNormalization, no "this scale is absent" (the
ops force a tensor) and no num_batches_tracked. `from_spec` writes the whole spec
configuration under one key; `to_spec` reads the graph first and takes a metadata
field only where the graph agrees with it, so an edited graph is never contradicted
by stale metadata.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from onnx import helper

from schemas import LayerReport, NormSpec
from schemas.floats import as_float32, decimal_complement, recover_from_float32

KEY = "normbridge.spec"


def attach(model, spec: NormSpec) -> None:
    """Write the spec configuration and num_batches_tracked under KEY."""
    fields = spec.config_dict()
    tracked = spec.tensors.get("num_batches_tracked")
    fields["num_batches_tracked"] = None if tracked is None else int(tracked)
    helper.set_model_props(model, {KEY: json.dumps(fields, sort_keys=True)})


def load(model) -> dict | None:
    """The metadata dict normbridge wrote, {} when there is none, None when it is unreadable."""
    for prop in model.metadata_props:
        if prop.key == KEY:
            try:
                fields = json.loads(prop.value)
            except ValueError:
                return None
            return fields if isinstance(fields, dict) else None
    return {}


def trusted(report: LayerReport, meta: dict, field: str, graph_value: Any, consistent: bool) -> Any:
    """meta[field] when present and `consistent` with the graph; else the graph's value (warning if they disagree)."""
    if field not in meta:
        return graph_value
    if consistent:
        return meta[field]
    report.warn(f"metadata {field}={meta[field]!r} disagrees with the graph; used the graph's {graph_value!r}.")
    return graph_value


def eps(report: LayerReport, meta: dict, stored: float, *, float32: bool = True) -> tuple[float, str]:
    """eps and eps_origin from a stored epsilon (float32 attribute, or an exact float64 constant)."""
    hint = meta.get("eps")
    value = recover_from_float32(stored, hint) if float32 else float(stored)
    if hint is not None and value != hint:
        report.warn(f"metadata eps={hint!r} disagrees with the graph's epsilon {stored!r}; used the graph's {value!r}.")
        return value, "explicit"
    if float32 and hint is None and value != stored:
        report.add("eps", stored, value, "translated", "float32 attribute read as its shortest decimal")
    return value, meta.get("eps_origin", "explicit") if hint is not None else "explicit"


def momentum(
    report: LayerReport, meta: dict, stored: float | None, tracked: int | None
) -> tuple[float | None, str | None]:
    """Momentum and convention from BatchNormalization's (running_weight, float32) attribute.

    `stored` is None when the attribute is absent (op default 0.9). Metadata momentum
    None is consistent with an absent attribute, or with the 1 - 1/(n+1) that
    `cumulative_momentum="next_step"` emits for n = num_batches_tracked.
    """
    graph = 0.9 if stored is None else recover_from_float32(stored)
    if "momentum" in meta:
        value, convention = meta["momentum"], meta.get("momentum_convention")
        if value is None:
            cumulative = (
                tracked is not None
                and stored is not None
                and as_float32(1.0 - 1.0 / (tracked + 1)) == as_float32(stored)
            )
            consistent = stored is None or cumulative
        else:
            running = value if convention == "running_weight" else decimal_complement(value)
            consistent = convention in ("batch_weight", "running_weight") and as_float32(running) == as_float32(graph)
        if consistent:
            return value, convention
        report.warn(
            f"metadata momentum={value!r} ({convention}) disagrees with the graph's momentum {graph!r}; used the graph's."
        )
    return graph, "running_weight"


def untracked_momentum(report: LayerReport, meta: dict, stored: float | None) -> tuple[float | None, str | None]:
    """The unused momentum of a layer without tracked statistics: the metadata's, kept only where the op holds none
    (InstanceNormalization) or its attribute agrees (`stored`, BatchNormalization's running_weight float32)."""
    value, convention = meta.get("momentum"), meta.get("momentum_convention")
    if (
        value is None
        or isinstance(value, bool)
        or not isinstance(value, (int, float))
        or convention not in ("batch_weight", "running_weight")
    ):
        return None, None
    if stored is not None:
        running = value if convention == "running_weight" else decimal_complement(value)
        if as_float32(running) != as_float32(stored):
            report.warn(
                f"metadata momentum={value!r} ({convention}) disagrees with the graph's momentum {stored!r}; the momentum is unused here and was dropped."
            )
            return None, None
    report.add("momentum", value, note=f"unused: statistics are not tracked; kept from metadata '{KEY}'")
    return float(value), convention


def affine_flag(report: LayerReport, meta: dict, field: str, array: np.ndarray, identity: float) -> bool:
    """scale/bias flag for a tensor ONNX forces: "absent" is trusted only if the tensor is the identity."""
    consistent = bool(meta.get(field, True)) or bool(np.all(array == identity))
    return bool(trusted(report, meta, field, True, consistent))


def num_batches_tracked(report: LayerReport, meta: dict) -> int | None:
    """The counter kept only in metadata (a non-negative int), or None."""
    value = meta.get("num_batches_tracked")
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    report.warn(f"metadata num_batches_tracked={value!r} is not a non-negative integer; ignored it.")
    return None
