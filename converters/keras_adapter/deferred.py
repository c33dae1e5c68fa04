"""Keras channel norms built on their first call, when the source takes several input ranks and records none.

Keras's BatchNormalization and GroupNormalization fix the input rank in `build` (their InputSpec's ndim;
BatchNormalization's reduction axes), but a PyTorch BatchNorm1d takes (N, C) and (N, C, L) and a GroupNorm
(N, C, *): building for one of them would refuse the others ("expected ndim=3, found ndim=2"). Such a layer is
left unbuilt, as any Keras layer is before its first call, and Keras builds it for the rank of its first input;
the spec's tensors are its variables' initial values, so they are bit-exact from the moment they exist.

The build is wrapped on the instance: the layer's initializers are swapped for the spec's tensors while
Keras makes the variables (the values never pass through an assignment, which inside a traced function
would run on every call) and put back afterwards, so `get_config()` and `.keras` files are those of a stock
layer. Until its first call the layer is read (`to_spec`) and run (`run_eval`, a training step) through a
built copy, so reading it does not fix its rank.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import numpy as np

from schemas import LayerReport, NormSpec, SpecError
from schemas.tensors import tensors_identical

from .. import markers
from .shapes import build_rank, channel_shape
from .variables import variable_dtype

#: Marker holding the pending state: {"<variable>_initializer": array, ...},
#: the channel count and the rank it is read at.
MARKER = "deferred_build"
#: Why the rank is left open, said in the report.
DEFERRED_NOTE = (
    "the source records no input rank and takes several ({takes}); a built Keras {cls} takes one (its InputSpec "
    "fixes ndim{axes}), so it is left unbuilt and Keras builds it for the rank of its first input, with the spec's "
    "tensors as its initial values (bit-exact); pass input_rank= to build it now for one rank"
)
#: What each source takes, by kind.
TAKES = {"batch": "BatchNorm1d takes (N, C) and (N, C, L)", "group": "GroupNorm takes (N, C, *) of any rank"}


def open_rank(spec: NormSpec) -> bool:
    """Whether the source takes several input ranks and records none: a BatchNorm1d (spatial_rank 1) or a GroupNorm."""
    if spec.input_rank is not None:
        return False
    return spec.kind == "group" or (spec.kind == "batch" and spec.spatial_rank == 1)


def channel_build_shape(
    spec: NormSpec, report: LayerReport, default: int, minimum: int = 2, layout: str = "channels_last"
) -> tuple[int | None, ...] | None:
    """The shape in `layout` a channel kind is built for (the rank given, or the kind's only rank), or None when the
    source takes several ranks and records none: the layer is then built on its first call
    (defer_build, which reports it)."""
    if open_rank(spec):
        return None
    return channel_shape(spec.num_features, build_rank(spec, report, default, minimum), layout)


def defer_build(layer: Any, spec: NormSpec, variables: Mapping[str, str], report: LayerReport) -> None:
    """Leave `layer` unbuilt; its first call builds it with the spec's tensors as the variables' values."""
    state = {
        f"{attribute}_initializer": spec.tensors[name].astype(variable_dtype(spec))
        for name, attribute in variables.items()
        if name in spec.tensors
    }
    read_rank = 2 + (spec.spatial_rank or 1)
    markers.remember(layer, **{MARKER: {"state": state, "channels": spec.num_features, "read_rank": read_rank}})
    _wrap_build(layer)
    axes = ", and BatchNormalization its reduction axes" if spec.kind == "batch" else ""
    note = DEFERRED_NOTE.format(takes=TAKES[spec.kind], cls=type(layer).__name__, axes=axes)
    report.add("input_rank", None, "rank of the first input", "translated", note)


def is_deferred(layer: Any) -> bool:
    """An unbuilt layer whose first call will build it with a spec's state (defer_build)."""
    return not layer.built and markers.recall(layer).get(MARKER) is not None


def built_copy(layer: Any, rank: int) -> Any:
    """A copy of a deferred layer built for `rank` (same class, config, markers and pending state);
    the layer stays unbuilt."""
    clone = type(layer).from_config(layer.get_config())
    markers.remember(clone, **markers.recall(layer))
    _wrap_build(clone)
    layout = "channels_first" if layer.axis in (1, 1 - rank) and rank > 2 else "channels_last"
    clone.build(channel_shape(markers.recall(layer)[MARKER]["channels"], rank, layout))
    return clone


def deferred_spec(layer: Any, read: Callable[[Any], NormSpec]) -> NormSpec:
    """The spec of a deferred layer: read from a copy built for the kind's usual rank, with no input rank
    (it has none yet)."""
    spec = read(built_copy(layer, markers.recall(layer)[MARKER]["read_rank"]))
    return spec.replace(input_rank=None)


class _Values:
    """An initializer giving one array, exactly: the spec's tensor as a variable's initial value."""

    def __init__(self, array: np.ndarray, layer: str, setting: str):
        self.array, self.layer, self.setting = array, layer, setting

    def __call__(self, shape: Any, dtype: Any = None) -> Any:
        from .runtime import import_keras

        if tuple(shape) != self.array.shape or (dtype is not None and str(np.dtype(self.array.dtype)) != str(dtype)):
            raise SpecError(
                f"the first call builds variable '{self.setting}' as {dtype}{list(shape)}, expected the spec's "
                f"{self.array.dtype}{list(self.array.shape)}; call the layer on inputs with {self.array.shape[0]} channels last.",
                layer=self.layer,
                setting=self.setting,
            )
        return import_keras().ops.convert_to_tensor(self.array, dtype=str(self.array.dtype))


def _wrap_build(layer: Any) -> None:
    """Swap the initializers for the pending state around Keras's own build, then put them back and drop the marker."""
    original = layer.build

    @functools.wraps(original)  # Keras reads the argument names of `build` (input_shape) from its signature
    def build_with_state(*args: Any, **kwargs: Any) -> None:
        pending = markers.recall(layer).get(MARKER)
        if pending is None:
            return original(*args, **kwargs)
        kept = {attribute: getattr(layer, attribute) for attribute in pending["state"]}
        for attribute, array in pending["state"].items():
            setattr(layer, attribute, _Values(array, layer.name, attribute.removesuffix("_initializer")))
        try:
            original(*args, **kwargs)
        finally:
            for attribute, initializer in kept.items():
                setattr(layer, attribute, initializer)
        markers.remember(layer, **{MARKER: None})
        _verify(layer, pending["state"])

    layer.build = build_with_state


def _verify(layer: Any, state: Mapping[str, np.ndarray]) -> None:
    """The variables hold the pending state bit for bit (read where they can be: not inside a traced function)."""
    for attribute, array in state.items():
        variable = getattr(layer, attribute.removesuffix("_initializer"))
        try:
            value = np.asarray(variable.numpy())
        except Exception:  # a symbolic value inside a trace: the initializer gave the array itself
            continue
        if not tensors_identical(value, array):
            raise SpecError(
                f"Keras variable '{variable.path}' was not built bit-identical to the spec's tensor.",
                layer=layer.name,
                setting=attribute.removesuffix("_initializer"),
            )
