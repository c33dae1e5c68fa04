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
ONNX_INPUTS: dict[str, dict[int, str]] = {info.onnx_op: dict(enumerate(info.onnx_inputs, start=1)) for info in KIND_INFO.values()}


def validate_spec(spec) -> None:
    """Run the kind's own rules, then the rules every state tensor obeys."""
    VALIDATORS[spec.kind](spec)
    check_common_tensors(spec)


__all__ = ["KIND_INFO", "KindInfo", "ONNX_INPUTS", "VALIDATORS", "validate_spec"]
