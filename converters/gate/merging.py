"""Putting together one CheckResult from parts of a check run in different processes.

A gate may check one layer's targets in two processes (converters/gate/split_check.py): each process runs `check(spec,
frameworks=...)` on some of the frameworks (a part of the check), and a worker may leave the round trips back to the
source framework to its caller (converters/gate/round_trips.py). Here the parts become the result `check(spec)` gives,
field for field.
"""

from __future__ import annotations

from schemas import CheckResult, NormSpec, NormbridgeError

from ..adapters import AdapterRegistry
from ..equivalence import CheckObjects, round_trip_differences, target_options, verdict
from ..options import ConversionOptions
from . import round_trips


def finish_round_trips(
    spec: NormSpec, checked: round_trips.Checked, registry: AdapterRegistry, objects: CheckObjects
) -> CheckResult:
    """A worker's result whose round trips it left to this process (converters/gate/round_trips.py), completed here as
    `_check_target` would have: each round trip run with `objects` (layers built as `check`'s) and its outcome put where
    `check` puts it. Raises what the round trip raises when it is not a NormbridgeError, as `check` does."""
    result = checked.result
    options = target_options(ConversionOptions())  # the options a worker checks its part with
    for trip in checked.round_trips:
        entry = next(e for e in result.targets if e.framework == trip.target)
        try:
            entry.round_trip_differences = round_trip_differences(
                spec, trip.target_spec, trip.expressed, options, objects
            )
        except NormbridgeError as error:  # as check_target: the target failed there, before its eval and training step
            result.outputs = [o for o in result.outputs if o.framework != trip.target]
            result.training_step = [s for s in result.training_step if s.framework != trip.target]
            del entry.warnings[trip.warnings :]
            entry.status, entry.reason = "failed", str(error)
            kept = [line for line in result.errors if line.split(":", 1)[0] != trip.target]
            result.errors = kept + [f"{trip.target}: {error}"]
            continue
        if trip.reached_end and entry.round_trip_differences:
            entry.status = "failed"
    rank = {name: i for i, name in enumerate(registry.framework_names)}
    # in target order, as check writes them
    result.errors.sort(key=lambda line: rank.get(line.split(":", 1)[0], len(rank)))
    result.passed = verdict(result)
    return result


def merge_parts(parts: list[CheckResult], order: list[str]) -> CheckResult:
    """One CheckResult from checks of the same spec on disjoint sets of frameworks (its legs:
    converters/gate/split_check.py runs some in a worker process): every entry in the place `check(spec)` over `order`
    puts it, and the same verdict."""
    rank = {name: i for i, name in enumerate(order)}

    def gathered(field: str, framework=lambda entry: entry.framework) -> list:
        entries = (entry for part in parts for entry in getattr(part, field))
        return sorted(entries, key=lambda entry: rank[framework(entry)])

    merged = parts[0].model_copy(
        update={
            "targets": gathered("targets"),
            "outputs": gathered("outputs"),
            "training_step": gathered("training_step"),
            "errors": gathered("errors", lambda error: error.split(":", 1)[0]),
        }
    )
    merged.passed = verdict(merged)
    return merged


__all__ = ["finish_round_trips", "merge_parts"]
