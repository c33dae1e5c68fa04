"""converters/gate/kept_objects.py: an object set lent to a check_many call is kept for the next call only if the call
ended without an error, and calls running at once never share one."""

from __future__ import annotations

import pytest

from converters.gate import kept_objects
from converters.gate.kept_objects import lent


class StandIn:
    """Stands in for a GroupObjects: what `lent` asks of one is `release`."""

    def __init__(self, registry):
        self.registry, self.released = registry, None

    def release(self, keep: int) -> None:
        self.released = keep


@pytest.fixture(autouse=True)
def no_kept_objects():
    kept_objects.forget()
    yield
    kept_objects.forget()


def test_an_object_set_is_kept_after_a_call_that_ended_and_dropped_after_one_that_raised():
    registry = object()
    with lent(registry, StandIn) as first:
        pass
    assert first.released == kept_objects.KEEP_CONFIGURATIONS  # released before it is kept
    with lent(registry, StandIn) as again:
        assert again is first
    with pytest.raises(RuntimeError), lent(registry, StandIn) as failed:
        raise RuntimeError("the call broke")
    assert failed is first
    with lent(registry, StandIn) as fresh:
        assert fresh is not first  # its layers are as the error left them: never lent again


def test_calls_at_once_borrow_object_sets_of_their_own_and_registries_never_share_one():
    registry, other = object(), object()
    with lent(registry, StandIn) as a, lent(registry, StandIn) as b, lent(other, StandIn) as c:
        assert len({id(a), id(b), id(c)}) == 3 and c.registry is other
    with lent(other, StandIn) as again:
        assert again is c
