"""Backoff: the pauses of a retry loop grow by their factor from the first to the cap, and reset."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlpulse.transport.backoff import Backoff

seconds = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)
factors = st.floats(min_value=1.0, max_value=10.0, allow_nan=False, allow_infinity=False)


def pauses_of(backoff: Backoff, count: int) -> list[float]:
    return [backoff.next() for _ in range(count)]


def test_the_loops_pauses_double_from_the_first_to_the_cap() -> None:
    assert pauses_of(Backoff(0.5, 5.0), 6) == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert pauses_of(Backoff(10.0, 300.0), 7) == [10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]
    assert pauses_of(Backoff(0.25, 5.0, factor=3.0), 4) == [0.25, 0.75, 2.25, 5.0]


@given(first_s=seconds, max_s=seconds, factor=factors)
def test_each_pause_is_the_last_times_the_factor_never_above_the_cap(
    first_s: float, max_s: float, factor: float
) -> None:
    pauses = pauses_of(Backoff(first_s, max_s, factor), 40)
    assert pauses[0] == min(first_s, max_s)
    for last, pause in itertools.pairwise(pauses):
        assert pause == min(last * factor, max_s)
        assert last <= pause <= max_s


@given(first_s=seconds, max_s=seconds, factor=st.floats(min_value=1.1, max_value=10.0))
def test_the_pauses_reach_the_cap_and_stay_there(
    first_s: float, max_s: float, factor: float
) -> None:
    pauses = pauses_of(Backoff(first_s, max_s, factor), 200)
    assert pauses[-2:] == [max_s, max_s]


@given(first_s=seconds, max_s=seconds, factor=factors, tries=st.integers(0, 50))
def test_reset_starts_the_pauses_again_from_the_first(
    first_s: float, max_s: float, factor: float, tries: int
) -> None:
    backoff = Backoff(first_s, max_s, factor)
    before = pauses_of(backoff, tries)
    backoff.reset()
    assert pauses_of(backoff, tries) == before
    backoff.reset()
    assert backoff.next() == min(first_s, max_s)


def test_a_factor_of_one_keeps_the_first_pause() -> None:
    assert pauses_of(Backoff(2.0, 30.0, factor=1.0), 3) == [2.0, 2.0, 2.0]


@pytest.mark.parametrize(
    ("first_s", "max_s", "factor"),
    [(0.0, 5.0, 2.0), (-1.0, 5.0, 2.0), (0.5, 0.0, 2.0), (0.5, 5.0, 0.5), (float("nan"), 5.0, 2.0)],
)
def test_pauses_that_cannot_grow_to_a_cap_are_refused(
    first_s: float, max_s: float, factor: float
) -> None:
    with pytest.raises(ValueError):
        Backoff(first_s, max_s, factor)
