"""`check_many`: `check` of many layers at once, each framework object built once per configuration.

Why: the registry's gate checks every normalizer of a model, and a model repeats a few configurations
(ResNet-50: 53 BatchNorms of a handful of shapes; a decoder: 160 identical RMSNorms). `check` builds each
layer from scratch per target: a Keras layer and its TensorFlow variables cost milliseconds, an
onnxruntime session about one. Here layers of one configuration (everything but the name and the
tensors' values: `configuration`) are checked together, with the same code as `check`
(equivalence.check_target) and a `GroupObjects` (group_objects.py) that changes only how the objects are made and run.

Anything else is `check`'s own code on the member's own objects. Results are field for field the ones
`[check(s) for s in specs]` gives, failures included (tests/converters/gate/test_grouped_check.py); a member
whose grouped check raises is checked again by `check` itself, so an error is the one `check` raises.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas import CheckResult, NormSpec

from .. import reference
from . import kept_objects
from ..adapters import REGISTRY, AdapterRegistry
from ..api import read_spec
from ..equivalence import check, check_target, new_result, target_options, verdict
from .group_objects import GroupObjects, configuration, restatable
from ..options import ConversionOptions
from ..probe import probe_input


def groups(specs: Sequence[NormSpec]) -> list[list[int]]:
    """Indices of `specs` by configuration, in order of first appearance."""
    return list(_by_configuration(specs).values())


def _by_configuration(specs: Sequence[NormSpec]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for index, spec in enumerate(specs):
        found.setdefault(configuration(spec), []).append(index)
    return found


def check_many(
    specs: Iterable[Any],
    frameworks: Iterable[str] | None = None,
    options: ConversionOptions | None = None,
    registry: AdapterRegistry = REGISTRY,
    progress: Callable[[int, NormSpec], None] | None = None,
) -> list[CheckResult]:
    """`[check(s, frameworks, options, registry) for s in specs]`, each object built once per configuration of layer.

    Raises what that list would raise: the error of the first spec whose `check` raises. `progress(i, spec)` is called
    as each spec's checks start. The objects are kept for later calls in this process (converters/gate/kept_objects.py).
    """
    with kept_objects.lent(registry, GroupObjects) as objects:  # a process's objects of earlier calls serve this one
        return _check_all(list(specs), frameworks, options, registry, progress, lambda: objects)


def _check_all(
    specs: list,
    frameworks: Iterable[str] | None,
    options: ConversionOptions | None,
    registry: AdapterRegistry,
    progress: Callable[[int, NormSpec], None] | None,
    objects: Callable[[], GroupObjects],
) -> list[CheckResult]:
    options = options or ConversionOptions()
    specs = [s if isinstance(s, NormSpec) else read_spec(s, registry=registry)[0] for s in specs]
    targets = list(registry.framework_names if frameworks is None else frameworks)
    outcomes: list[CheckResult | Exception | None] = [None] * len(specs)
    for config, members in _by_configuration(specs).items():
        group = objects()
        group.members([specs[i] for i in members], config)
        checked = _check_group(
            [specs[i] for i in members],
            targets,
            options,
            group,
            None if progress is None else lambda j, members=members: progress(members[j], specs[members[j]]),
        )
        for index, outcome in zip(members, checked):
            outcomes[index] = outcome
    results = []
    for spec, outcome in zip(specs, outcomes):
        # A member whose grouped check raised is checked by `check` itself: the error is check's
        # (or, if check passes it, its result).
        results.append(check(spec, targets, options, registry) if isinstance(outcome, Exception) else outcome)
    return results


class Checker:
    """`check` of one spec after another, the objects built for earlier ones kept for later ones of the same
    configuration.

    A check worker (converters/gate/check_worker.py) answers a gate's requests one spec at a time; this gives it what
    check_many gives a whole model. At most `keep` configurations' objects are kept; calls are serialised.
    """

    def __init__(self, registry: AdapterRegistry = REGISTRY, keep: int = 64):
        self._registry, self._keep = registry, keep
        self._objects = GroupObjects(registry)
        self._lock = threading.Lock()

    def check(
        self, spec: NormSpec, frameworks: Iterable[str] | None = None, options: ConversionOptions | None = None
    ) -> CheckResult:
        with self._lock:
            self._objects.forget_beyond(self._keep)
            return _check_all([spec], frameworks, options, self._registry, None, lambda: self._objects)[0]


_CHECKERS: dict[int, tuple[AdapterRegistry, Checker]] = {}
_CHECKERS_LOCK = threading.Lock()


def checker_for(registry: AdapterRegistry) -> Checker:
    """This process's Checker for `registry` (a check worker keeps its objects across the requests it answers)."""
    with _CHECKERS_LOCK:
        held = _CHECKERS.get(id(registry))
        if held is None or held[0] is not registry:
            held = _CHECKERS[id(registry)] = (registry, Checker(registry))
        return held[1]


@dataclass
class _Member:
    """One spec's check in progress (`error`: what its check raised, which ends it)."""

    spec: NormSpec
    x_cf: np.ndarray | None
    y_ref: np.ndarray | None
    result: CheckResult | None
    source_step: Callable[[], reference.TrainStep] | None
    error: Exception | None = None


def _check_group(
    specs: list[NormSpec],
    targets: list[str],
    options: ConversionOptions,
    objects: GroupObjects,
    progress: Callable[[int], None] | None,
) -> list[CheckResult | Exception]:
    """check() of specs of one configuration, target by target, through one GroupObjects."""
    members, probe = [], None
    for spec in specs:
        try:
            # The probe is a function of fields every member shares (kind, shapes, layout, dtype): made once,
            # copied per member.
            probe = probe_input(spec) if probe is None else probe
            x_cf = probe.copy()
            members.append(
                _Member(
                    spec,
                    x_cf,
                    reference.forward(spec, x_cf, training=False),
                    new_result(spec, x_cf),
                    functools.cache(lambda spec=spec, x_cf=x_cf: reference.train_step(spec, x_cf)),
                )
            )
        except Exception as error:  # check raises it before any target: checked again by check itself
            members.append(_Member(spec, None, None, None, None, error))
    for target in targets:
        with _unchanged_objects(objects.registry, target):
            _check_target_of_members(members, target, options, objects, progress if target == targets[0] else None)
    for member in members:
        if member.error is None:
            member.result.passed = verdict(member.result)
    return [member.error or member.result for member in members]


def _unchanged_objects(registry: AdapterRegistry, target: str) -> contextlib.AbstractContextManager:
    """The target framework's block for objects nobody changes (the set's own, written and read and run by the check);
    no block where the framework cannot be had: each member's check_target meets that error and says it as check
    does."""
    try:
        framework = registry.framework(target)
    except Exception:  # noqa: BLE001
        return contextlib.nullcontext()
    return framework.unchanged_objects()


def _check_target_of_members(
    members: list[_Member],
    target: str,
    options: ConversionOptions,
    objects: GroupObjects,
    progress: Callable[[int], None] | None,
) -> None:
    objects.write_ahead(target, [m.spec for m in members if m.error is None], target_options(options))
    for index, member in enumerate(members):
        if member.error is not None:
            continue
        if progress is not None:
            progress(index)
        try:
            check_target(
                member.spec, target, options, member.x_cf, member.y_ref, member.result, member.source_step, objects
            )
        except Exception as error:  # check would stop here: the member is checked again by check itself
            member.error = error


__all__ = ["Checker", GroupObjects, "check_many", "checker_for", "configuration", "groups", "restatable"]
