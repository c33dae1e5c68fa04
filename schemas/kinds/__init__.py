"""Per-kind rules of the spec: one module per normalizer kind, looked up explicitly."""

from __future__ import annotations

from . import batch, group, instance, layer, rms
from ._checks import check_common_tensors

#: Explicit table; a kind without a validator is a bug caught by tests/test_coverage.py.
VALIDATORS = {
    "batch": batch.validate,
    "layer": layer.validate,
    "rms": rms.validate,
    "group": group.validate,
    "instance": instance.validate,
}


def validate_spec(spec) -> None:
    """Run the kind's own rules, then the rules every state tensor obeys."""
    VALIDATORS[spec.kind](spec)
    check_common_tensors(spec)
