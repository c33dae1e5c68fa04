"""Rebuilding the custom Keras class a probed layer was read from (keras_hub's Gemma RMSNormalization, T5LayerNorm,
...).

A spec the behavioural probe read (probed.py) records the class's import path and its variables' names
(`Source.module_class`, `Source.state_names`). Converting it back to Keras rebuilds that class when it can be
done without running anything a file chose, as Keras's own `safe_mode` loading resolves custom classes:

- the class is looked up, never imported: among the classes registered with `keras.saving` (what a `.keras`
  file may name), then in a module already imported in this process; a spec can come from a file, and a
  module it names is never imported for it;
- it is a `keras.layers.Layer` and not a `Lambda` (whose configuration carries code);
- it is constructed with what its signature takes of the spec: the eps (`epsilon`, `eps`, `variance_epsilon`), the name,
  the dtype, and the feature count when it requires one argument (`keras_hub.layers.RMSNormalization(input_dim)`);
  nothing from a stored configuration is deserialised;
- built for the spec's input rank, given the spec's tensors bit for bit, the probe proves it again as the same spec
  (kind, eps, axes, scale offset).

Otherwise None is returned with the reason, and the stock class is built as before.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from schemas import LayerReport, NormSpec, spec_differences

from .. import markers
from .probe import EPS_ATTRIBUTES, short_name
from .runtime import import_keras
from .shapes import trailing_shape
from .variables import write_variable


def restore_class(spec: NormSpec) -> tuple[Any | None, str]:
    """(the rebuilt source class, how) or (None, why not)."""
    path, names = spec.source.module_class, spec.source.state_names
    if spec.source.framework != "keras" or not path or names is None:
        return None, "the spec records no source class"
    cls, how_found = find_class(path)
    if cls is None:
        return None, how_found
    try:
        layer = _construct(cls, spec)
        _build(layer, spec)
        variables = {short_name(v): v for v in layer.weights}
        for role, name in names.items():
            if name not in variables:
                return (
                    None,
                    f"a rebuilt {cls.__name__} has no variable '{name}' to hold the spec's {role} (it has {sorted(variables)})",
                )
            write_variable(variables[name], spec.tensors[role], layer=spec.name, setting=role)
    except Exception as error:  # a constructor or a build that does not take the spec: the stock class is built instead
        return (
            None,
            f"{cls.__name__} could not be rebuilt with the spec's state ({type(error).__name__}: {str(error).strip()[:200]})",
        )
    layer, how = _proved(layer, spec, cls, how_found)
    if layer is not None and layer.name != spec.name:
        if layer.name == spec.name.replace(
            "/", "_"
        ):  # Keras names cannot hold '/': the original is remembered, as for stock layers
            markers.remember(layer, name=spec.name)
        else:
            how += f"; its constructor takes no name, so it is named {layer.name!r}, not {spec.name!r}"
    return layer, how


def find_class(path: str) -> tuple[type | None, str]:
    """The Keras layer class at `path` among the registered and the already imported ones, or (None, why not)."""
    keras = import_keras()
    module_name, _, qualname = path.rpartition(".")
    registered = [
        obj for obj in keras.saving.get_custom_objects().values() if isinstance(obj, type) and _path_of(obj) == path
    ]
    cls, how = (
        (registered[0], "registered with keras.saving")
        if registered
        else (_imported(module_name, qualname), "already imported")
    )
    if cls is None:
        return None, (
            f"{path} is neither registered with keras.saving nor in a module this process has imported; normbridge never "
            "imports a module a spec names (import it, or register the class, to have it rebuilt)"
        )
    if not isinstance(cls, type) or not issubclass(cls, keras.layers.Layer):
        return None, f"{path} is not a keras.layers.Layer class"
    if issubclass(cls, keras.layers.Lambda):
        return None, f"{path} is a Lambda layer, whose configuration carries code; it is never rebuilt"
    return cls, how


def _path_of(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _imported(module_name: str, qualname: str) -> Any:
    """The attribute chain `qualname` of an imported module; None when the module is not imported or has no such
    name."""
    found: Any = sys.modules.get(module_name)
    for part in qualname.split(".") if found is not None else ():
        if part == "<locals>":
            return None
        found = getattr(found, part, None)
    return found


def _construct(cls: type, spec: NormSpec) -> Any:
    """cls(...) with the arguments its signature takes: the feature count when one argument is required, eps,
    name, dtype."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    open_keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    named = {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    required = [
        p
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if len(required) > 1:
        raise TypeError(f"its constructor requires {[p.name for p in required]}, which a spec does not give")
    args = (spec.normalized_shape[-1],) if required else ()
    kwargs: dict[str, Any] = {}
    eps_name = next((name for name in EPS_ATTRIBUTES if name in named), None)
    if eps_name is not None:
        kwargs[eps_name] = spec.eps
    for keyword, value in (("name", spec.name.replace("/", "_")), ("dtype", spec.dtype)):
        if keyword in named or open_keywords:
            kwargs[keyword] = value
    return cls(*args, **kwargs)


def _build(layer: Any, spec: NormSpec) -> None:
    """Build for the spec's input rank (its trailing normalised sizes); a class that made its weights in __init__ only
    records it."""
    rank = spec.input_rank or len(spec.normalized_shape) + 2
    if not layer.built or not (layer.get_build_config() or {}).get("input_shape"):
        layer.build(trailing_shape(spec.normalized_shape, rank))


def _proved(layer: Any, spec: NormSpec, cls: type, how_found: str) -> tuple[Any | None, str]:
    """The layer when the probe reads it back as `spec` (its state bit for bit), else (None, the first difference)."""
    from .probed import probed_spec

    try:
        found = probed_spec(
            layer,
            spec.kind,
            LayerReport(
                layer=spec.name, kind=spec.kind, source_framework="keras", target_framework="spec", target_op="NormSpec"
            ),
        )
    except Exception as error:  # the probe does not prove the rebuilt layer: say why
        return (
            None,
            f"the rebuilt {cls.__name__} is not proved a {spec.kind} normalization ({str(error).strip()[:200]})",
        )
    differences = spec_differences(spec, found, ignore=("source", "input_rank", "name"))
    if differences:
        return None, f"the rebuilt {cls.__name__} computes another spec ({differences[0]})"
    return layer, f"rebuilt as {_path_of(cls)} ({how_found}), proved equal to the spec on a probe"


__all__ = ["find_class", "restore_class"]
