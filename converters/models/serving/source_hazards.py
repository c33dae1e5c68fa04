"""The hazards of a model about to be served: what `inspect` reports on it, at warning level and above.

The serving export repeats them so that a file that passes its contract is not mistaken for a
model fit to serve: BatchNorms that never saw data pass the contract (the ONNX file computes what
the untrained source computes) and still serve nonsense. Error-level hazards (outputs that depend
on the batch) refuse the export unless forced; info-level ones (an unusual eps) stay in `inspect`.
"""

from __future__ import annotations

from typing import Any

from schemas.serving import ServingHazard

from ..inspection import inspect_model

#: Severities the serving export repeats.
REPEATED = ("warning", "error")


def serving_hazards(model: Any) -> list[ServingHazard]:
    """Every warning- and error-level hazard `inspect_model` finds in `model`, model-level first,
    then per layer in order."""
    inspection = inspect_model(model)
    return [
        ServingHazard(layer=where, code=h.code, severity=h.severity, message=h.message)
        for where, h in inspection.all_hazards()
        if h.severity in REPEATED
    ]


__all__ = ["REPEATED", "serving_hazards"]
