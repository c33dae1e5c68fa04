"""`recognize()`: a user's declaration of what a normalization class of their own computes.

    import converters
    converters.recognize(MyNorm, kind="rms", eps="variance_epsilon")

The declaration says where the class keeps eps (an attribute name, or the number itself), its
scale and bias (attribute names, or None), its running statistics (batch), and settings no
attribute holds (scale_offset, compute_dtype, the channels_first layout). It is not trusted: the
torch recognizer (`torch_adapter/recognizers/computed.py`) builds the spec it describes for each instance and
proves it on a probe against the NumPy reference, exactly as it does for what it reads from a
traced graph; an instance whose output differs is reported as an unrecognised normalization.
This module imports no framework, so declaring costs nothing until a model is read.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from schemas import DuplicateAdapterError, SpecError

KINDS = ("rms", "layer", "batch")


@dataclass(frozen=True)
class Declaration:
    """What `recognize` was told about one class."""

    cls: type
    kind: str
    eps: str | float
    weight: str | None = "weight"
    bias: str | None = None
    running_mean: str | None = None
    running_var: str | None = None
    scale_offset: float = 0.0
    compute_dtype: str | None = None
    cast_before_affine: bool = False
    layout: str | None = None
    frozen: bool = True


_DECLARED: dict[type, Declaration] = {}
_LOCK = threading.Lock()


def recognize(
    cls: type,
    *,
    kind: str,
    eps: str | float,
    weight: str | None = "weight",
    bias: str | None = None,
    running_mean: str | None = None,
    running_var: str | None = None,
    scale_offset: float = 0.0,
    compute_dtype: str | None = None,
    cast_before_affine: bool = False,
    layout: str | None = None,
) -> Declaration:
    """Declare that instances of `cls` compute a `kind` normalization; proved on a probe per instance before use.

    Args:
        cls: the module class (its subclasses are covered too).
        kind: "rms", "layer" or "batch" (batch: frozen running statistics, as FrozenBatchNorm2d).
        eps: the attribute holding eps ("variance_epsilon"), or the value when the class hard-codes it.
        weight, bias, running_mean, running_var: attribute names of those tensors (None: absent).
        scale_offset: 1.0 when the affine factor is `1 + weight` (Gemma).
        compute_dtype: "float32" when the class upcasts a narrower input before its statistics.
        cast_before_affine: with compute_dtype, the cast back happens before the weight multiply (Llama).
        layout: "channels_first" for a layer/rms norm over axis 1 of an (N, C, ...) input (ConvNeXt).

    Raises:
        DuplicateAdapterError: `cls` was declared before.
        SpecError: a kind or setting outside what a declaration can say.
    """
    if kind not in KINDS:
        raise SpecError(
            f"recognize({cls.__name__}): kind '{kind}' cannot be declared; use one of {', '.join(KINDS)}.",
            setting="kind",
        )
    if kind == "batch" and (running_mean is None or running_var is None):
        raise SpecError(
            f"recognize({cls.__name__}): a batch norm needs running_mean= and running_var= attribute names.",
            setting="running_var",
        )
    if layout not in (None, "channels_first"):
        raise SpecError(
            f"recognize({cls.__name__}): layout must be None or 'channels_first' (got {layout!r}).", setting="layout"
        )
    declaration = Declaration(
        cls,
        kind,
        eps,
        weight,
        bias,
        running_mean,
        running_var,
        float(scale_offset),
        compute_dtype,
        cast_before_affine,
        layout,
    )
    with _LOCK:
        if cls in _DECLARED:
            raise DuplicateAdapterError(
                f"{cls.__qualname__} was already declared with recognize(); forget() it first to change it."
            )
        _DECLARED[cls] = declaration
    return declaration


def forget(cls: type) -> None:
    """Remove the declaration of `cls` (nothing if there is none)."""
    with _LOCK:
        _DECLARED.pop(cls, None)


def declaration_of(obj: object) -> Declaration | None:
    """The declaration covering `obj`'s class (its own first, then its bases'), or None."""
    with _LOCK:
        for cls in type(obj).__mro__:
            if cls in _DECLARED:
                return _DECLARED[cls]
    return None


__all__ = ["Declaration", "declaration_of", "forget", "recognize"]
