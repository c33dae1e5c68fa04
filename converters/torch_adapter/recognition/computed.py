"""Recognising a torch module by what it computes: trace it, read the normalization, prove it.

A module that is not a stock torch.nn normalization but looks like one (its class name contains
"Norm", or it keeps a 1-D `weight` and has no children; or it subclasses a stock class and
overrides `forward`, like ConvNeXt's channels_first LayerNorm) is exported alone on a probe
input (`torch.export`), its aten ops read by `norm_graph.derive` (or, for a class declared with
`converters.recognize`, its attributes read as declared), and the spec accepted only if the module's
output on a probe matches the NumPy reference (`norm_proof`). What fails is remembered with the
reason, so inspection names it as an unrecognised normalization instead of skipping it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from schemas import NormSpec
from schemas.kinds import KIND_INFO

from ... import markers
from ...recognizers.declared import declaration_of
from .. import torch_internals
from . import norm_proof
from .aten_calls import _Reader
from .derived_spec import TORCH_OF, build_spec, dtype_name, own_normalized_shape, scalar_attributes, to_torch
from .norm_graph import NotANormalization, derive
from .norm_names import names_a_norm, says_no_norm
from .traced_groups import whole_program_group

STOCK = tuple(getattr(torch.nn, n) for info in KIND_INFO.values() for n in info.stock_classes("torch"))


@dataclass(frozen=True)
class Recognition:
    """The outcome for one candidate module: its proved spec, or why none was accepted."""

    spec: NormSpec | None
    reason: str | None
    why_candidate: str
    how: str = ""  # "traced" or "declared"


def why_candidate(module: torch.nn.Module) -> str | None:
    """Why `module` looks like a normalization that the stock classes do not cover, or None."""
    cls = type(module)
    if isinstance(module, torch.nn.SyncBatchNorm):
        return "a SyncBatchNorm"
    if cls in STOCK or (cls.__module__ or "").startswith("converters."):
        return None  # normbridge's own classes (torch_adapter/biased_batch_norm.py) are read by their adapters
    stock = next((base for base in STOCK if isinstance(module, base)), None)
    if stock is not None:
        return f"a {stock.__name__} subclass with its own forward" if cls.forward is not stock.forward else None
    if declaration_of(module) is not None:
        return "declared with converters.recognize"
    if (cls.__module__ or "").startswith("torch."):
        return None
    children = list(module.children())
    if names_a_norm(cls.__name__) and not any(
        why_candidate(m) or isinstance(m, STOCK) for m in module.modules() if m is not module
    ):
        return f"its class name {cls.__name__} contains 'Norm'"
    weight = getattr(module, "weight", None)
    if not children and isinstance(weight, torch.Tensor) and weight.dim() == 1 and not says_no_norm(cls.__name__):
        return "it keeps a 1-D weight and has no child modules"
    return None


_CACHE: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()
_LOCK = threading.RLock()


def recognition(module: Any, shape: tuple[int, ...] | None = None) -> Recognition | None:
    """The Recognition of a candidate module (cached while its state is unchanged), None for any other object.

    `shape`: an input shape the module is known to be applied to (the spec's, when a class is rebuilt from one), tried
    before the probe shapes guessed from its state.
    """
    if not isinstance(module, torch.nn.Module):
        return None
    why = why_candidate(module)
    if why is None:
        return None
    key = (_fingerprint(module), shape)
    with _LOCK:
        cached = _CACHE.get(module)
        if cached is not None and cached[0] == key:
            return cached[1]
    result = _recognise(module, why, shape)
    with _LOCK:
        _CACHE[module] = (key, result)
    return result


def class_path(module: torch.nn.Module) -> str | None:
    """The import path of the module's class, when it is importable by that path (not a class defined in a function)."""
    cls = type(module)
    return None if "<" in cls.__qualname__ else f"{cls.__module__}.{cls.__qualname__}"


def _fingerprint(module: torch.nn.Module) -> tuple:
    """What a cached verdict depends on: the module's tensors and settings, its name, and its class's declaration (which
    `recognize` and `forget` change after an instance was first read)."""
    state = tuple(
        (n, t.data_ptr(), torch_internals.version_counter(t), tuple(t.shape), t.dtype)
        for n, t in _state(module).items()
    )
    return state, scalar_attributes(module), markers.recall(module).get("name"), declaration_of(module)


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters(recurse=False)), **dict(module.named_buffers(recurse=False))}


def _name(module: torch.nn.Module) -> str:
    return markers.recall(module).get("name") or type(module).__name__


def _recognise(module: torch.nn.Module, why: str, shape: tuple[int, ...] | None = None) -> Recognition:
    declaration = declaration_of(module)
    if declaration is not None:
        from .declared_spec import declared_spec

        try:
            spec, shape = declared_spec(module, declaration, _name(module))
        except NotANormalization as error:
            return Recognition(None, f"its declaration does not fit it: {error}", why, "declared")
        problem = prove(module, spec, shape)
        return Recognition(
            spec if problem is None else None, problem and f"its declaration does not hold: {problem}", why, "declared"
        )
    reused = _from_template(module, why)
    if reused is not None:
        return reused
    reasons, unexportable = [], []
    shapes = probe_shapes(module)
    for shape in [shape, *(s for s in shapes if s != shape)] if shape is not None else shapes:
        try:
            spec = traced_spec(module, shape)
        except _Unexportable as error:
            unexportable.append(f"on a {tuple(shape)} input {error}")
            continue
        except NotANormalization as error:
            reasons.append(f"on a {tuple(shape)} input {error}")
            continue
        problem = prove(module, spec, shape)
        if problem is None:
            return Recognition(spec, None, why, "traced")
        _TEMPLATES.pop(_template_key(module), None)
        reasons.append(f"read as a {spec.kind} norm on a {tuple(shape)} input, {problem}")
    return Recognition(
        None, "; ".join(reasons or unexportable) or "it keeps no 1-D tensor to size a probe", why, "traced"
    )


#: (class, state shapes and dtypes, plain settings) -> (probe shape, Derivation) of a module proved before: the ops a
#: module traces to depend on nothing else, so its twins (the 5 RMSNorms of a decoder) skip the export, never the proof.
_TEMPLATES: dict[tuple, tuple] = {}


def _template_key(module: torch.nn.Module) -> tuple:
    shapes = tuple((n, tuple(t.shape), t.dtype) for n, t in _state(module).items())
    return type(module), shapes, scalar_attributes(module)


def _from_template(module: torch.nn.Module, why: str) -> Recognition | None:
    with _LOCK:
        template = _TEMPLATES.get(_template_key(module))
    if template is None:
        return None
    shape, derivation = template
    try:
        spec = build_spec(
            derivation,
            _state(module),
            name=_name(module),
            layer_type=type(module).__name__,
            module_class=class_path(module),
            training=bool(module.training),
            input_dtype=_module_dtype(module),
        )
    except NotANormalization:
        return None
    return Recognition(spec, None, why, "traced") if prove(module, spec, shape) is None else None


class _Unexportable(NotANormalization):
    """The probe's shape does not fit the module (the other probe shape may)."""


def probe_shapes(module: torch.nn.Module) -> list[tuple[int, ...]]:
    """Inputs to try: (N, L, C) for a trailing norm, (N, C, H, W) for a channel one; C from its 1-D state. A module with
    no state (OLMo's OlmoLayerNorm: layer_norm without weight or bias) is sized by its `normalized_shape` attribute."""
    vectors = [t for t in _state(module).values() if t.dim() == 1 and t.is_floating_point()]
    if not vectors:
        shape = own_normalized_shape(module)
        return [(4, 3, *shape)] if shape else []
    c = int(vectors[0].shape[0])
    trailing, channels = (4, 3, c), (4, c, 3, 5)
    # Last: a sequence with its channels first, as SqueezeBERT's LayerNorm subclass takes (N, C, W) and permutes it; a
    # module that fits only this shape fails on the others (its permutation has three axes),
    # and so would be left unrecognised.
    sequence = (4, c, 5)
    channel_first = any(n in _state(module) for n in ("running_mean", "running_var")) or isinstance(
        module, torch_internals.norm_base_classes()
    )
    return [channels, trailing, sequence] if channel_first else [trailing, channels, sequence]


def _module_dtype(module: torch.nn.Module) -> torch.dtype:
    tensors = [t for t in _state(module).values() if t.is_floating_point()]
    return tensors[0].dtype if tensors else torch.get_default_dtype()


def traced_spec(module: torch.nn.Module, shape: tuple[int, ...]) -> NormSpec:
    """The spec read from `module`'s aten ops when exported alone on an input of `shape`."""
    dtype = _module_dtype(module)
    probe = copy.deepcopy(module).eval()
    try:
        with _quiet_tracing():
            program = torch.export.export(probe, (torch.zeros(shape, dtype=dtype),))
    except Exception as error:  # a module that cannot run on this shape: the next probe is tried
        raise _Unexportable(
            f"it could not be exported ({type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''})"
        )
    group = whole_program_group(program)
    derivation = derive(group)
    if derivation.native is not None:
        return _native_spec(program, derivation, module, shape)
    with _LOCK:
        _TEMPLATES[_template_key(module)] = (shape, derivation)
    return build_spec(
        derivation,
        _state(module),
        name=_name(module),
        layer_type=type(module).__name__,
        module_class=class_path(module),
        training=bool(module.training),
        input_dtype=dtype,
    )


@contextlib.contextmanager
def _quiet_tracing():
    """torch logs a traceback at ERROR for every shape a probe does not fit; a failed probe is expected here."""
    logger = logging.getLogger(torch_internals.FAKE_TENSOR_LOGGER)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _native_spec(program: Any, derivation, module: torch.nn.Module, shape) -> NormSpec:
    """batch/group/instance ops: their arguments read as in a program (aten_calls.py),
    then the module's own name and mode."""
    layer = _Reader(program).read(derivation.native, derivation.kind, _name(module), type(module).__name__)
    if layer.spec is None:
        raise NotANormalization(f"its {derivation.native.target} could not be read: {layer.problem}")
    spec = layer.spec
    changes = {"source": spec.source.model_copy(update={"layer_type": type(module).__name__})}
    if KIND_INFO[spec.kind].running_stats and spec.track_running_stats:
        changes["training"] = bool(module.training)
    return spec.replace(**changes)


def prove(module: torch.nn.Module, spec: NormSpec, shape: tuple[int, ...]) -> str | None:
    """None when `module` computes `spec` on a probe of `shape` (in eval mode), else how it differs."""
    x = norm_proof.as_dtype(norm_proof.probe_input(shape, spec.eps), spec.dtype)
    runner = copy.deepcopy(module).eval()
    try:
        with torch.no_grad():
            y = runner(to_torch(x, TORCH_OF[spec.dtype]))
    except Exception as error:
        return f"it fails on the probe ({type(error).__name__})"
    if not isinstance(y, torch.Tensor):
        return f"it returns a {type(y).__name__}, not a tensor"
    dtype_name(y.dtype, "output")
    return norm_proof.disagreement(spec, x, y.detach().to(torch.float64).numpy())


__all__ = ["Recognition", "probe_shapes", "prove", "recognition", "traced_spec", "why_candidate"]
