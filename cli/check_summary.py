"""The lines `register` and `mlflow import` print about a registration's equivalence checks.

Why its own module: "N/N passed" alone read as if every layer had been checked in every framework, while a leg a
framework cannot express (a Keras mixed-precision layer's float32 state in torch and ONNX) or a runtime cannot evaluate
passes the layer without checking it there. What was not checked is said, per framework, with the first layer and why.
"""

from __future__ import annotations

from collections.abc import Sequence

#: TargetCheck statuses that mean a framework's leg did not check the layer.
UNCHECKED = {"not_expressible": "not expressible", "skipped": "not evaluated"}


def check_lines(checks: Sequence) -> list[tuple[str, str]]:
    """`checks` (schemas.CheckResult) as (Rich markup prefix, plain text) lines (fitting.say_marked prints them): the
    summary, then one line per framework that left layers unchecked."""
    passed = sum(check.passed for check in checks)
    lines = [("  checks    ", f"{passed}/{len(checks)} normalization layers passed the round-trip equivalence check")]
    unchecked: dict[str, list[tuple[str, str, str]]] = {}
    for check in checks:
        for target in check.targets:
            if target.status in UNCHECKED:
                unchecked.setdefault(target.framework, []).append(
                    (check.layer, UNCHECKED[target.status], target.reason)
                )
    for framework, layers in unchecked.items():
        layer, why, reason = layers[0]
        first = (
            reason.rstrip(".") if f"'{layer}'" in reason else f"'{layer}': {reason.rstrip('.')}"
        )  # the first one, named once
        lines.append(
            ("  [yellow]not checked[/] ", f"in {framework}: {len(layers)} of {len(checks)} layers ({why}: {first})")
        )
    return lines


__all__ = ["check_lines"]
