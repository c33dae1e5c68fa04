"""Field-by-field comparison of two specs: the basis of round-trip checks and diffs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from .tensors import tensors_identical

#: Fields that describe how a layer sits in its own framework rather than what it computes:
#: they legitimately change when a layer moves to another framework.
FRAMEWORK_BOUND_FIELDS: tuple[str, ...] = ("source", "layout", "variance_estimator", "input_rank")


@dataclass(frozen=True)
class Difference:
    """One field (or tensor) that differs between two specs."""

    field: str
    left: Any
    right: Any

    def __str__(self) -> str:
        return f"{self.field}: {self.left!r} != {self.right!r}"


def _tensor_summary(array) -> str:
    return "absent" if array is None else f"{array.dtype}{list(array.shape)}"


def spec_differences(a, b, ignore: Iterable[str] = FRAMEWORK_BOUND_FIELDS) -> list[Difference]:
    """Differences between specs `a` and `b`, skipping `ignore`d fields.

    Momentum is compared in one convention (decimal complement), so PyTorch 0.1 and
    Keras 0.9 are the same momentum. Tensors must be bit-identical.
    """
    ignored = set(ignore)
    diffs: list[Difference] = []
    for field in type(a).model_fields:
        if field in ignored or field in ("tensors", "momentum", "momentum_convention"):
            continue
        left, right = getattr(a, field), getattr(b, field)
        if left != right:
            diffs.append(Difference(field, left, right))
    if "momentum" not in ignored:
        left, right = a.momentum_as("batch_weight"), b.momentum_as("batch_weight")
        if left != right:
            diffs.append(
                Difference(
                    "momentum", f"{a.momentum!r} ({a.momentum_convention})", f"{b.momentum!r} ({b.momentum_convention})"
                )
            )
    if "tensors" not in ignored:
        for name in sorted(set(a.tensors) | set(b.tensors)):
            if name in ignored:
                continue
            left, right = a.tensors.get(name), b.tensors.get(name)
            if left is None or right is None or not tensors_identical(left, right):
                diffs.append(
                    Difference(
                        f"tensors.{name}",
                        _tensor_summary(left),
                        _tensor_summary(right) if right is None or left is None else "different bytes",
                    )
                )
    return diffs
