"""What every Keras kind adapter reads the same way: name, dtype, eps and the remembered mode.

Keras has no per-layer mode (it is chosen per call) and no name with '/'; what it cannot hold is
remembered on the in-memory layer (converters.markers) and trusted only while it agrees with the layer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pydantic

from schemas import LayerReport, NormSpec, SpecError
from schemas.floats import dtype_default_eps

from .. import markers
from .runtime import import_keras, source
from .variables import layer_dtypes, narrow_state


STORED_NOTE = "kept on the in-memory layer only (normbridge marker)"


MODE_NOTE = "Keras has no per-layer mode; call it with training=...; " + STORED_NOTE


def spec_name(layer: Any, report: LayerReport) -> str:
    """The layer's name, or the remembered original when it sanitises to it."""
    remembered = markers.recall(layer).get("name")
    if remembered is None:
        return layer.name
    if isinstance(remembered, str) and remembered and remembered.replace("/", "_") == layer.name:
        return remembered
    report.warn(
        f"the remembered name {remembered!r} does not match the layer's name {layer.name!r}; using the layer's name."
    )
    return layer.name


@dataclass(frozen=True)
class KerasFacts:
    """What every kind reads the same way: name, dtype, eps and the remembered mode."""

    name: str
    dtype: str
    compute_dtype: str | None
    eps: float
    eps_origin: str
    training: bool

    def spec(self, layer: Any, kind: str, tensors: dict[str, np.ndarray], **fields: Any) -> NormSpec:
        """The validated spec; a framework state pydantic rejects becomes a SpecError naming the layer."""
        if self.compute_dtype is not None:
            tensors, state_dtype = narrow_state(layer, tensors, self.dtype)
            if state_dtype is not None:
                fields = {**fields, "state_dtype": state_dtype}
        try:
            return NormSpec(
                name=self.name,
                kind=kind,
                eps=self.eps,
                eps_origin=self.eps_origin,
                training=self.training,
                dtype=self.dtype,
                compute_dtype=self.compute_dtype,
                source=source(layer),
                tensors=tensors,
                **fields,
            )
        except pydantic.ValidationError as error:
            first = error.errors()[0]
            setting = ".".join(str(p) for p in first["loc"]) or None
            raise SpecError(
                f"the layer's settings do not form a valid {kind} spec ({first['msg']}); fix the layer's configuration.",
                layer=layer.name,
                setting=setting,
            ) from None


def read_facts(layer: Any, report: LayerReport) -> KerasFacts:
    """Name, dtype, eps and the remembered training flag and eps origin (trusted only when they agree)."""
    dtype, compute_dtype = layer_dtypes(layer)
    eps = layer.epsilon
    if eps is None:
        # ops.layer_normalization / rms_normalization fall back to keras.config.epsilon().
        eps = import_keras().config.epsilon()
        report.warn(f"epsilon=None: Keras uses keras.config.epsilon() = {eps!r}; the spec records that number.")
    eps = float(eps)
    remembered = markers.recall(layer)
    training = remembered.get("training", False)
    if not isinstance(training, bool):
        report.warn(f"the remembered training flag {training!r} is not a bool; reading the layer as in inference mode.")
        training = False
    eps_origin = remembered.get("eps_origin", "explicit")
    if eps_origin == "dtype_eps" and eps != dtype_default_eps(dtype):
        report.warn(
            f"eps was emitted as PyTorch's eps=None for {dtype} ({dtype_default_eps(dtype)!r}) but is now {eps!r}; "
            "it is read as an explicit eps."
        )
        eps_origin = "explicit"
    elif eps_origin not in ("explicit", "dtype_eps"):
        report.warn(f"the remembered eps origin {eps_origin!r} is unknown; it is read as an explicit eps.")
        eps_origin = "explicit"
    return KerasFacts(
        name=spec_name(layer, report),
        dtype=dtype,
        compute_dtype=compute_dtype,
        eps=eps,
        eps_origin=eps_origin,
        training=training,
    )


def without_training(facts: KerasFacts) -> KerasFacts:
    return replace(facts, training=False)
