"""A worker's round trips back to the source framework, left to its caller, which has that framework imported.

Why: `check` converts the layer it read from each target back to the source framework and reads it again (the round
trip). A worker running a .pt2's Keras and ONNX legs imported torch for that alone, about 1 s on the first
registration's critical path (and Keras, 3 s, for a .keras model's torch legs), while its caller had read the model
and imported torch already. When the worker has not imported the source framework, its request runs inside
`deferring()`: `equivalence._check_target` records what the round trip needs (`hold`: the layer read from the target
and the spec it must equal) instead of running it, and goes on with the eval and the training step; the caller runs it
(`equivalence.finish_round_trips`) and puts its outcome where `check` puts it: the target's round-trip differences, its
status where they fail it, and, where the round trip raises, the target failed with that error and without the outputs
and training step `check` would not have reached. So the result is `check`'s field for field
(tests/converters/gate/test_split_check.py, on the case table and the broken adapters). One difference remains: where a
spec's round trip and a later step of another of its targets both raise an error that is not a NormbridgeError (an
adapter's crash), the later one is raised (both abort the registration).
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import json
from collections.abc import Iterator
from dataclasses import dataclass

from schemas import CheckResult, NormSpec, TargetCheck
from schemas.spec_io import spec_from_parts, spec_to_json, tensors_to_bytes


@dataclass
class RoundTrip:
    """One target's round trip to run in the caller: what `_check_target` had when it got there."""

    target: str
    target_spec: NormSpec  #: the layer read from the target
    expressed: NormSpec  #: what it must equal (equivalence.target_spec_of)
    warnings: (
        int  #: the target's warnings then: the later ones are the training step's, which a raising round trip prevents
    )
    reached_end: bool = (
        False  #: whether the check reached the line where differences fail the target (not skipped, not raised)
    )

    def fields(self) -> dict:
        return {
            "target": self.target,
            "target_spec": _spec_fields(self.target_spec),
            "expressed": _spec_fields(self.expressed),
            "warnings": self.warnings,
            "reached_end": self.reached_end,
        }

    @classmethod
    def from_fields(cls, fields: dict) -> "RoundTrip":
        return cls(
            fields["target"],
            _spec_of(fields["target_spec"]),
            _spec_of(fields["expressed"]),
            int(fields["warnings"]),
            bool(fields["reached_end"]),
        )


@dataclass
class Checked:
    """A worker's answer for one spec whose round trips were deferred: its result so far and the round trips to run."""

    result: CheckResult
    round_trips: list[RoundTrip]


class Held:
    """The round trips deferred inside one `deferring()` block, by the result they belong to."""

    def __init__(self):
        self._by_result: dict[
            int, tuple[CheckResult, list[RoundTrip]]
        ] = {}  # the result is kept, so its id is not reused

    def add(self, result: CheckResult, trip: RoundTrip) -> None:
        self._by_result.setdefault(id(result), (result, []))[1].append(trip)

    def of(self, result: CheckResult) -> list[RoundTrip]:
        return self._by_result.get(id(result), (None, []))[1]


_HELD: contextvars.ContextVar[Held | None] = contextvars.ContextVar("deferred_round_trips", default=None)


@contextlib.contextmanager
def deferring() -> Iterator[Held]:
    """Within the block, checks in this thread defer their round trips; the Held tells each result's."""
    held = Held()
    token = _HELD.set(held)
    try:
        yield held
    finally:
        _HELD.reset(token)


def hold(result: CheckResult, entry: TargetCheck, target_spec: NormSpec, expressed: NormSpec) -> RoundTrip | None:
    """The round trip of `entry`'s target, recorded for the caller when deferring; None: run it now."""
    held = _HELD.get()
    if held is None:
        return None
    trip = RoundTrip(entry.framework, target_spec, expressed, len(entry.warnings))
    held.add(result, trip)
    return trip


def _spec_fields(spec: NormSpec) -> dict:
    return {
        "document": json.loads(spec_to_json(spec)),
        "tensors": base64.b64encode(tensors_to_bytes(spec)).decode("ascii"),
    }


def _spec_of(fields: dict) -> NormSpec:
    return spec_from_parts(fields["document"], base64.b64decode(fields["tensors"], validate=True))
