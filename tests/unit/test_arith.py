"""The shared exact arithmetic never raises and gives the IEEE answer where fsum cannot."""

from __future__ import annotations

import math
import sys

import pytest

from rlpulse.rules.arith import exact_mean, exact_std, exact_sum, exact_var

MAX = sys.float_info.max
INF = math.inf


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1e308, 1e308, -1e308], 1e308),  # a partial sum overflows, the exact sum does not
        ([1e308, 1e308, -INF], -INF),
        ([INF, -INF], math.nan),
        ([MAX, MAX], INF),
    ],
)
def test_exact_sum(values: list[float], expected: float) -> None:
    got = exact_sum(values)
    assert got == expected or (math.isnan(got) and math.isnan(expected))


def test_mean_of_huge_values_is_representable() -> None:
    assert exact_mean([MAX, MAX, MAX]) == MAX
    assert math.isnan(exact_mean([1e308, 1e308, INF, -INF]))
    assert math.isnan(exact_mean([]))


def test_variance_matches_the_design_formula() -> None:
    assert exact_var([1.0, 1.0, 1.0, 1.0, 3.0]) == math.fsum([0.16] * 4 + [2.56]) / 5
    assert exact_var([1e200, -1e200]) == INF  # squares overflow: IEEE says inf, not an error
    assert math.isnan(exact_std([1.0, INF]))
