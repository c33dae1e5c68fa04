"""Rebuilding the class a torch layer was read from (LlamaRMSNorm, ConvNextLayerNorm, ...) instead of a stock one.

A spec read from a class no stock adapter covers records the class's import path and the names of its tensors
(`Source.module_class`, `Source.state_names`). Converting such a spec back to torch rebuilds that class when
it can be done without running anything a file chose:

- the class's module is already imported in this process, or is a module of transformers (importing an
  installed library by a name a file holds runs only that library's code; any other module is never
  imported for it);
- its constructor is known (CONSTRUCTORS), or is ConvNeXt's `(normalized_shape, eps=, data_format=)` (a
  subclass of nn.LayerNorm whose constructor takes `data_format`: ConvNextV2LayerNorm, SamLayerNorm, ...),
  or else `cls(size, eps=eps)` is tried;
- the rebuilt module, given the spec's tensors bit for bit, is recognised again as the same spec (kind,
  eps, axes, offsets, compute dtype: `computed.recognition`, proved on a probe against the NumPy reference).

Otherwise None is returned with the reason, and the stock class is built as before.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable

import torch

from schemas import NormSpec, spec_differences

from .. import markers
from .common import SPEC_TO_TORCH, tensor_from_numpy
from .recognition.computed import recognition

#: Library packages whose modules may be imported to rebuild a class (their normalization classes are listed below).
IMPORTABLE = ("transformers.models.",)


def _size(spec: NormSpec) -> int:
    return spec.num_features or spec.normalized_shape[0]


def _size_eps(spec: NormSpec) -> tuple[tuple, dict]:
    return (_size(spec),), {"eps": spec.eps}


def _convnext(spec: NormSpec) -> tuple[tuple, dict]:
    return (_size(spec),), {
        "eps": spec.eps,
        "data_format": "channels_first" if spec.layout == "channels_first" else "channels_last",
    }


def _size_only(spec: NormSpec) -> tuple[tuple, dict]:
    return (_size(spec),), {}


#: Class name -> (args, kwargs) of its constructor for a spec: the transformers classes the recognizers read.
CONSTRUCTORS: dict[str, Callable[[NormSpec], tuple[tuple, dict]]] = {
    "LlamaRMSNorm": _size_eps,
    "Qwen2RMSNorm": _size_eps,
    "MistralRMSNorm": _size_eps,
    "GemmaRMSNorm": _size_eps,
    "T5LayerNorm": _size_eps,
    "ConvNextLayerNorm": _convnext,
    "DetrFrozenBatchNorm2d": _size_only,
    "RTDetrFrozenBatchNorm2d": _size_only,  # eps 1e-5 is written in their forward
}


def restore_class(spec: NormSpec) -> tuple[torch.nn.Module | None, str]:
    """(the rebuilt source class, how) or (None, why not)."""
    path, names = spec.source.module_class, spec.source.state_names
    if spec.source.framework != "torch" or not path or names is None:
        return None, "the spec records no source class"
    module_name, _, class_name = path.rpartition(".")
    cls, why = _importable(module_name, class_name)
    if cls is None:
        return None, why
    args, kwargs = _constructor(cls)(spec)
    try:
        module = cls(*args, **kwargs).to(SPEC_TO_TORCH[spec.dtype])
        with torch.no_grad():
            for role, name in names.items():
                getattr(module, name).copy_(tensor_from_numpy(spec.tensors[role].copy()))
    except Exception as error:  # a constructor or a state it does not take: the stock class is built instead
        call = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        return (
            None,
            f"{class_name}({call}) could not be rebuilt with the spec's state ({type(error).__name__}: {error})",
        )
    module.train(spec.training)
    markers.remember(module, name=spec.name)
    found = recognition(module, _applied_shape(spec))
    if found is None or found.spec is None:
        return (
            None,
            f"the rebuilt {class_name} is not recognised as a normalization ({found.reason if found else 'not a candidate'})",
        )
    differences = spec_differences(spec, found.spec, ignore=("source", "input_rank"))
    if differences:
        return None, f"the rebuilt {class_name} computes another spec ({differences[0]})"
    return module, f"rebuilt as {path}, proved equal to the spec on a probe"


def _applied_shape(spec: NormSpec) -> tuple[int, ...] | None:
    """A probe shape of the rank the layer was applied at, for a channels-first layer: a class may take only that rank (
    SqueezeBERT's LayerNorm subclass permutes (N, C, W) with three axes), so it is proved there first."""
    if spec.layout != "channels_first" or not spec.input_rank or spec.input_rank < 3:
        return None
    return (4, _size(spec), *(5, 3, 2)[: spec.input_rank - 2])


def _constructor(cls: type) -> Callable[[NormSpec], tuple[tuple, dict]]:
    if cls.__name__ in CONSTRUCTORS:
        return CONSTRUCTORS[cls.__name__]
    try:
        takes_format = (
            issubclass(cls, torch.nn.LayerNorm) and "data_format" in inspect.signature(cls.__init__).parameters
        )
    except (TypeError, ValueError):
        takes_format = False
    return _convnext if takes_format else _size_eps


def _importable(module_name: str, class_name: str) -> tuple[type | None, str]:
    module = sys.modules.get(module_name)
    if module is None:
        if not module_name.startswith(IMPORTABLE):
            return (
                None,
                f"{module_name} is not imported, and normbridge imports only {', '.join(IMPORTABLE)}* modules to rebuild a class",
            )
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # not installed, or another version
            return None, f"{module_name} is not importable ({type(error).__name__})"
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        return None, f"{module_name} has no module class {class_name}"
    return cls, ""


__all__ = ["CONSTRUCTORS", "restore_class"]
