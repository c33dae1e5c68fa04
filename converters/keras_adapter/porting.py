"""Keras side of porting (converters.models.porting): writing a converted layer's state into a layer that already sits
in a model.

The layer is never replaced (its name, its place in the graph and its connections stay):
its variables are assigned bit-exactly and `epsilon`/`momentum` are set. Keras reads both
attributes when a call is traced, so a model's cached train/test/predict functions, traced
with the old values, are dropped afterwards (see reset_compiled).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas import LayerReport, NotExpressibleError

from .. import markers
from .deferred import built_copy, is_deferred
from .runtime import import_keras
from .shapes import built_input_shape
from .variables import read_variable, write_variable

#: Keras variable attribute -> (spec setting, identity value). RMSNormalization keeps its
#: weight in `scale`; the other layers use `scale`/`center` as flags and gamma/beta as weights.
_AFFINE = {"gamma": ("scale", 1.0), "beta": ("bias", 0.0)}
_RMS_AFFINE = {"scale": ("scale", 1.0)}
_STATISTICS = ("moving_mean", "moving_variance")


def _variable(layer: Any, attribute: str) -> Any:
    value = getattr(layer, attribute, None)
    return value if value is not None and hasattr(value, "assign") else None


def _affine_attributes(layer: Any) -> dict[str, tuple[str, float]]:
    return _RMS_AFFINE if isinstance(layer, import_keras().layers.RMSNormalization) else _AFFINE


@dataclass
class KerasWrite:
    """The writes that make `target` hold what `fresh` (the converter's own layer) holds."""

    target: Any
    steps: list[Callable[[], None]] = field(default_factory=list)


def plan_write(fresh: Any, target: Any, path: str, report: LayerReport) -> KerasWrite:
    """Check that `target` can hold `fresh`'s state and return the writes (nothing is written yet)."""
    plan = KerasWrite(target)
    if is_deferred(
        fresh
    ):  # a BatchNorm1d or GroupNorm with no recorded rank, built on first call: its state at the target's rank
        fresh = built_copy(fresh, len(built_input_shape(target)))
    for attribute, (setting, identity) in _affine_attributes(target).items():
        ours, theirs = _variable(fresh, attribute), _variable(target, attribute)
        if ours is not None and theirs is None:
            flag = "scale" if setting == "scale" else "center"
            raise NotExpressibleError(
                f"the source has a {setting} but the target {type(target).__name__} '{target.name}' was built with {flag}=False; "
                f"rebuild the target layer with {flag}=True.",
                layer=path,
                setting=setting,
                target="keras",
            )
        if ours is not None:
            plan.steps.append(_copy(ours, theirs, target.name, setting))
        elif theirs is not None:
            plan.steps.append(_fill(theirs, identity, target.name, setting))
            report.add(
                setting,
                False,
                f"{attribute} = {identity:g}",
                "approximate",
                f"the target layer has a learned {attribute} the source lacks; set to the identity",
            )
            report.warn(
                f"the target's {attribute} was set to {identity:g} (the identity) because the source has no {setting}; it stays trainable, "
                f"so training the target moves it where the source's would not exist."
            )
    for attribute in _STATISTICS:
        ours, theirs = _variable(fresh, attribute), _variable(target, attribute)
        if (ours is None) != (theirs is None):
            raise NotExpressibleError(
                f"the converted layer {'has' if ours is not None else 'has no'} '{attribute}' but the target {type(target).__name__} "
                f"'{target.name}' {'has none' if theirs is None else 'has one'}; the layers are not twins.",
                layer=path,
                setting="track_running_stats",
                target="keras",
            )
        if ours is not None:
            plan.steps.append(_copy(ours, theirs, target.name, attribute))
    for attribute in ("epsilon", "momentum"):
        if hasattr(fresh, attribute):
            plan.steps.append(_set(target, attribute, getattr(fresh, attribute)))
    extras = {key: value for key, value in markers.recall(fresh).items() if key != "name"}
    kept_name = markers.recall(target).get("name")
    if kept_name is not None:
        extras["name"] = kept_name
    plan.steps.append(lambda: object.__setattr__(target, markers.ATTRIBUTE, extras))
    if "frozen_identity" in extras and not fresh.trainable:
        # The converter freezes a scale it emitted as ones (RMSNormalization without a scale): do the same.
        plan.steps.append(_set(target, "trainable", False))
    elif "frozen_identity" in markers.recall(target) and not target.trainable:
        # An earlier port froze this layer's identity scale; it now holds a real one.
        plan.steps.append(_set(target, "trainable", True))
    return plan


def _copy(source: Any, target: Any, layer: str, setting: str) -> Callable[[], None]:
    return lambda: write_variable(target, read_variable(source), layer=layer, setting=setting)


def _fill(target: Any, value: float, layer: str, setting: str) -> Callable[[], None]:
    return lambda: write_variable(
        target, np.full(tuple(target.shape), value, dtype=str(target.dtype)), layer=layer, setting=setting
    )


def _set(obj: Any, name: str, value: Any) -> Callable[[], None]:
    return lambda: setattr(obj, name, value)


def snapshot(layer: Any) -> Callable[[], None]:
    """A function that puts `layer` back as it is now (variables, epsilon, momentum, trainable, markers)."""
    variables = [(variable, read_variable(variable)) for variable in layer.weights]
    attributes = {name: getattr(layer, name) for name in ("epsilon", "momentum", "trainable") if hasattr(layer, name)}
    restore_markers = markers.restorer(layer)

    def restore() -> None:
        for variable, saved in variables:
            variable.assign(saved)
        for name, value in attributes.items():
            if getattr(layer, name) != value:
                setattr(layer, name, value)
        restore_markers()

    return restore


def reset_compiled(model: Any) -> None:
    """Drop the model's traced train/test/predict functions: they hold the old epsilon and momentum."""
    for name in ("train_function", "test_function", "predict_function"):
        if getattr(model, name, None) is not None:
            setattr(model, name, None)
