"""converters/kept_benches.py: a bench lent to a check_many call is kept for the next call only if the call ended without
an error, and calls running at once never share one."""

from __future__ import annotations

import pytest

from converters import kept_benches
from converters.kept_benches import lent


class Bench:
    """Stands in for a GroupBench: what `lent` asks of one is `release`."""

    def __init__(self, registry):
        self.registry, self.released = registry, None

    def release(self, keep: int) -> None:
        self.released = keep


@pytest.fixture(autouse=True)
def no_kept_benches():
    kept_benches.forget()
    yield
    kept_benches.forget()


def test_a_bench_is_kept_after_a_call_that_ended_and_dropped_after_one_that_raised():
    registry = object()
    with lent(registry, Bench) as first:
        pass
    assert first.released == kept_benches.KEEP_CONFIGURATIONS  # released before it is kept
    with lent(registry, Bench) as again:
        assert again is first
    with pytest.raises(RuntimeError), lent(registry, Bench) as failed:
        raise RuntimeError("the call broke")
    assert failed is first
    with lent(registry, Bench) as fresh:
        assert fresh is not first  # its layers are as the error left them: never lent again


def test_calls_at_once_borrow_benches_of_their_own_and_registries_never_share_one():
    registry, other = object(), object()
    with lent(registry, Bench) as a, lent(registry, Bench) as b, lent(other, Bench) as c:
        assert len({id(a), id(b), id(c)}) == 3 and c.registry is other
    with lent(other, Bench) as again:
        assert again is c
