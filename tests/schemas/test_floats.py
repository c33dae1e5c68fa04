"""eps and momentum survive float32 storage and convention flips exactly."""

from __future__ import annotations

from hypothesis import given, strategies as st

from schemas.floats import as_float32, decimal_complement, recover_from_float32, shortest_float32_decimal

# What users write: decimals with a few significant digits, over many magnitudes.
user_decimals = st.builds(
    lambda digits, exponent: float(f"{digits}e{exponent}"), st.integers(1, 999999), st.integers(-12, -1)
)


def test_known_values():
    assert as_float32(1e-5) == 9.999999747378752e-06 != 1e-5
    assert shortest_float32_decimal(as_float32(1e-5)) == 1e-05
    assert decimal_complement(0.1) == 0.9 and decimal_complement(0.9) == 0.1
    assert 1 - (1 - 0.1) != 0.1  # the trap the decimal complement avoids


@given(user_decimals)
def test_float32_storage_recovers_user_decimals(value):
    # Any decimal of at most 6 significant digits is the shortest decimal of its float32.
    assert recover_from_float32(as_float32(value)) == value


@given(user_decimals)
def test_hint_wins_when_it_rounds_to_the_same_float32(value):
    assert recover_from_float32(as_float32(value), hint=value) == value
    assert recover_from_float32(as_float32(value), hint=value * 3 + 1) == shortest_float32_decimal(as_float32(value))


@given(st.integers(1, 999999), st.integers(1, 8))
def test_momentum_complement_round_trips(digits, places):
    value = digits / 10 ** max(places, len(str(digits)))
    if 0 < value < 1:
        assert decimal_complement(decimal_complement(value)) == value
