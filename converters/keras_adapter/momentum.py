"""Keras's momentum convention, and what Keras cannot hold of a running-statistics layer
(PyTorch's convention, num_batches_tracked)."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from schemas import LayerReport, NormSpec

from .. import markers
from .facts import STORED_NOTE


#: Keras reads momentum as the weight of the running value: moving = m * moving + (1 - m) * batch.
RUNNING_WEIGHT = "running_weight"


def recall_running(layer: Any, report: LayerReport, layer_momentum: float) -> dict[str, Any]:
    """momentum, momentum_convention and the num_batches_tracked tensor, from the marker when it agrees.

    The remembered momentum (as given, in its own convention) is used only if it was
    emitted as the value the layer still holds; otherwise the layer's wins.
    """
    remembered = markers.recall(layer)
    fields: dict[str, Any] = {"momentum": layer_momentum, "momentum_convention": RUNNING_WEIGHT}
    tensors: dict[str, np.ndarray] = {}
    count = remembered.get("num_batches_tracked")
    if count is not None:
        if isinstance(count, numbers.Integral) and not isinstance(count, bool) and count >= 0:
            tensors["num_batches_tracked"] = np.array(int(count), dtype=np.int64)
        else:
            report.warn(f"the remembered num_batches_tracked {count!r} is not a non-negative integer; it is dropped.")
    if "momentum_emitted" in remembered:
        value, convention = remembered.get("momentum"), remembered.get("momentum_convention")
        emitted = remembered["momentum_emitted"]
        valid = (value is None and convention is None and "num_batches_tracked" in tensors) or (
            isinstance(value, float) and convention in ("batch_weight", RUNNING_WEIGHT)
        )
        if valid and emitted == layer_momentum:
            fields = {"momentum": value, "momentum_convention": convention}
        else:
            report.warn(
                f"the remembered momentum {value!r} ({convention}) was emitted as {emitted!r} but the layer now holds {layer_momentum!r}; using the layer's value."
            )
    return {**fields, "tensors": tensors}


def remember_running(layer: Any, spec: NormSpec, report: LayerReport, emitted: float) -> None:
    """Keep the momentum as given (with its convention) and num_batches_tracked, which Keras cannot hold."""
    fields: dict[str, Any] = {
        "momentum": spec.momentum,
        "momentum_convention": spec.momentum_convention,
        "momentum_emitted": emitted,
    }
    if "num_batches_tracked" in spec.tensors:
        count = int(spec.tensors["num_batches_tracked"])
        fields["num_batches_tracked"] = count
        report.add("num_batches_tracked", count, count, "stored", STORED_NOTE + "; dropped from .keras files")
    if spec.momentum_convention != RUNNING_WEIGHT:
        given = (
            f"{spec.momentum!r} ({spec.momentum_convention})"
            if spec.momentum is not None
            else "None (cumulative average)"
        )
        report.add(
            "momentum_convention",
            spec.momentum_convention,
            RUNNING_WEIGHT,
            "stored",
            f"the momentum as given, {given}, is " + STORED_NOTE,
        )
    markers.remember(layer, **fields)
