"""Object sets lent to check_many calls and kept between them, so a process that gates model after model builds and
traces a configuration's objects once, not once per call.

Why: a GroupObjects made per call pays, per configuration, a from_spec per framework and, for a group of KEEP_RUNS_FROM
members or more, three tf.function traces (about 45 ms: close to a millisecond per member of a ResNet-50). A registry
process or a check worker checks models whose normalizers share few configurations, again and again. Each call borrows
an object set of its own (concurrent calls never share one), returns it when it ends normally, and a call that raised
drops it (its layers are left as the error left them). What an object set keeps between calls is what it keeps between
groups of one call: template layers that `restate` rewrites wholly for every member
(Checker relies on the same), bounded by `forget_beyond`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

#: Configurations' objects a kept object set holds at most; registries and idle object sets per registry kept at most.
KEEP_CONFIGURATIONS, KEEP_REGISTRIES, KEEP_IDLE = 64, 4, 2

_IDLE: dict[
    int, tuple[Any, list[Any]]
] = {}  # id(registry) -> (registry, its idle object sets), the most recently used last
_LOCK = threading.Lock()


@contextlib.contextmanager
def lent(registry: Any, make: Callable[[Any], Any]) -> Iterator[Any]:
    """An object set for `registry`: an idle kept one, else `make(registry)`;
    kept again if the block ends without an error."""
    with _LOCK:
        held = _IDLE.pop(id(registry), None)
        if held is None or held[0] is not registry:
            held = (registry, [])
        _IDLE[id(registry)] = held
        objects = held[1].pop() if held[1] else make(registry)
    yield objects  # an error raised in the block propagates, and the object set is not kept
    objects.release(KEEP_CONFIGURATIONS)
    with _LOCK:
        if len(held[1]) < KEEP_IDLE:
            held[1].append(objects)
        while len(_IDLE) > KEEP_REGISTRIES:
            _IDLE.pop(next(iter(_IDLE)))  # the least recently used registry's object sets


def forget() -> None:
    """Drop every kept objects (tests that need a call to build its objects afresh)."""
    with _LOCK:
        _IDLE.clear()


__all__ = ["KEEP_CONFIGURATIONS", "forget", "lent"]
