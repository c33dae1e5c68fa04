"""Per-kind rules and facts of the spec: one module per normalizer kind, `<kind>.py`, holding its `INFO` and `validate`.

The modules are found from the vocabulary's KINDS, each by its name: a kind whose module is
missing fails this import, naming it. Every per-kind table elsewhere is a view of KIND_INFO.
"""

from __future__ import annotations

from importlib import import_module

from ..vocabulary import KINDS
from ._checks import check_common_tensors
from .info import KindInfo

_MODULES = {kind: import_module(f"{__name__}.{kind}") for kind in KINDS}

#: kind -> its facts (schemas/kinds/<kind>.py: INFO).
KIND_INFO: dict[str, KindInfo] = {kind: module.INFO for kind, module in _MODULES.items()}
#: kind -> its validation rules (schemas/kinds/<kind>.py: validate).
VALIDATORS = {kind: module.validate for kind, module in _MODULES.items()}
#: ONNX op -> {input position: spec tensor} (how a native node's initializers map onto a spec).
ONNX_INPUTS: dict[str, dict[int, str]] = {
    info.onnx_op: dict(enumerate(info.onnx_inputs, start=1)) for info in KIND_INFO.values() if info.onnx_op is not None
}


def register_kind(module) -> None:
    """Add a kind at run time from `module`, which holds its INFO (a KindInfo) and validate(spec), as `<kind>.py` here
    does; a kind known already raises. Called through converters.adapters.REGISTRY.add_kind."""
    kind = module.INFO.kind
    if kind in KIND_INFO:
        raise ValueError(f"kind '{kind}' is already known; choose another name.")
    KIND_INFO[kind] = module.INFO
    VALIDATORS[kind] = module.validate
    if module.INFO.onnx_op is not None:
        ONNX_INPUTS[module.INFO.onnx_op] = dict(enumerate(module.INFO.onnx_inputs, start=1))


def remove_kind(kind: str) -> None:
    """Take a kind added by `register_kind` out again (the vocabulary's kinds stay)."""
    if kind in KINDS:
        raise ValueError(f"kind '{kind}' is one of the vocabulary's and cannot be removed.")
    info = KIND_INFO.pop(kind, None)
    VALIDATORS.pop(kind, None)
    if info is not None and info.onnx_op is not None:
        ONNX_INPUTS.pop(info.onnx_op, None)


def validate_spec(spec) -> None:
    """Run the kind's own rules, then the rules every state tensor obeys."""
    VALIDATORS[spec.kind](spec)
    check_common_tensors(spec)


__all__ = ["KIND_INFO", "KindInfo", "ONNX_INPUTS", "VALIDATORS", "register_kind", "remove_kind", "validate_spec"]
