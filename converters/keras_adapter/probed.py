"""Specs of custom Keras normalization layers the behavioural probe proved (keras_adapter/probe.py).

The stock kind adapters (rms.py, layer.py) hand a layer that is not of a stock class to
`probed_spec`; the spec then holds the layer's own variables, its proved eps, Gemma's affine
factor `1 + w` as `scale_offset=1.0`, and the class and variable names it was read from, so
converting it back to Keras rebuilds that class (restoring.py).
"""

from __future__ import annotations

from typing import Any

from schemas import LayerReport, NormSpec, UnsupportedObjectError

from .facts import KerasFacts, spec_name
from .probe import probe_layer, short_name
from .runtime import keras_class
from .variables import layer_dtype, read_variable


def is_stock(layer: Any, class_names: tuple[str, ...]) -> bool:
    return isinstance(layer, tuple(keras_class(name) for name in class_names))


def probed_spec(layer: Any, kind: str, report: LayerReport) -> NormSpec:
    """The spec of a custom layer the probe proved to compute `kind`; UnsupportedObjectError naming the reason
    otherwise."""
    result = probe_layer(layer)
    norm = result.norm
    if norm is None or norm.kind != kind:
        found = "nothing it could prove" if norm is None else f"a {norm.kind} normalization"
        raise UnsupportedObjectError(
            f"the {kind} adapter got a {type(layer).__module__}.{type(layer).__qualname__}, in which the behavioural probe found {found}"
            f"{': ' + result.reason if result.reason else ''}; pass a layer that computes a {kind} normalization.",
            layer=getattr(layer, "name", None),
        )
    variables = {short_name(v): v for v in layer.weights}
    tensors = {}
    if norm.scale is not None:
        tensors["scale"] = read_variable(variables[norm.scale])
    if norm.bias is not None:
        tensors["bias"] = read_variable(variables[norm.bias])
    facts = KerasFacts(
        name=spec_name(layer, report),
        dtype=layer_dtype(layer),
        compute_dtype=None,
        eps=norm.eps,
        eps_origin="explicit",
        training=False,
    )
    offset = f", affine factor {norm.scale_offset:g} + {norm.scale}" if norm.scale_offset else ""
    report.warn(
        f"{type(layer).__name__} is not a stock Keras layer: read by the behavioural probe ({kind} over the last {len(norm.normalized_shape)} "
        f"axis/axes, eps {norm.eps!r}{offset}), proved against the NumPy reference on probe inputs."
    )
    spec = facts.spec(
        layer,
        kind,
        tensors,
        normalized_shape=norm.normalized_shape,
        input_rank=norm.input_rank,
        scale=norm.scale is not None,
        bias=norm.bias is not None,
        scale_offset=norm.scale_offset,
    )
    # The class and its variables' names, so converting back to Keras can rebuild it (restoring.py).
    roles = {role: name for role, name in (("scale", norm.scale), ("bias", norm.bias)) if name is not None}
    cls = type(layer)
    return spec.replace(
        source=spec.source.model_copy(
            update={"module_class": f"{cls.__module__}.{cls.__qualname__}", "state_names": roles}
        )
    )
