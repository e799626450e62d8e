"""Exact reductions shared by the step joiner, the rule evaluator and the backtest.

docs/design.md ("Rules") fixes the arithmetic so that every component computes
bit-identical values: ``mean = fsum(x) / n``, ``var = fsum((x - mean)^2) / n``
(population), ``std = sqrt(var)``.
Any NaN input gives NaN; for ``var``/``std``/``zscore``/``slope`` any infinite input gives
NaN as well; ``sum``/``mean``/``min``/``max`` follow IEEE arithmetic for infinities.

IEEE results throughout, and never an exception: a square is the product ``x * x``
(correctly rounded everywhere; ``x ** 2`` goes to libm's pow, which is not, and raises
OverflowError); a sum is fsum's correctly rounded exact sum, also where ``math.fsum``
raises instead (inf + -inf: NaN; a partial sum of finite values leaving the double range:
the exact sum, rounded once, +-inf only if that overflows); a mean whose fsum overflows is
the exact mean, rounded once (it is always representable).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from types import MappingProxyType
from typing import Final

NAN = float("nan")


def _fraction_sum(values: Sequence[float]) -> Fraction:
    return sum(map(Fraction, values), Fraction(0))


def exact_sum(terms: Iterable[float]) -> float:
    """``math.fsum``, with the IEEE answer where it raises; NaN if any value is NaN."""
    values = list(terms)
    try:
        return math.fsum(values)
    except ValueError:  # inf + -inf
        return NAN
    except OverflowError:  # a partial sum overflowed
        special = [value for value in values if not math.isfinite(value)]
        if special:  # NaN, or the infinities decide
            return exact_sum(special)
        exact = _fraction_sum(values)
        try:
            return exact.numerator / exact.denominator  # correctly rounded
        except OverflowError:
            return math.inf if exact > 0 else -math.inf


def exact_mean(values: Sequence[float]) -> float:
    """``fsum(x) / n``; the exact mean rounded once where the sum leaves the double range."""
    n = len(values)
    if not n:
        return NAN
    try:
        return math.fsum(values) / n
    except ValueError:  # inf + -inf
        return NAN
    except OverflowError:  # a partial sum overflowed
        special = [value for value in values if not math.isfinite(value)]
        if special:
            return exact_sum(special)
        exact = _fraction_sum(values) / n  # |mean| <= max |x|: representable
        return exact.numerator / exact.denominator


def exact_var(values: Sequence[float]) -> float:
    """Population variance ``fsum((x - mean)^2) / n``; NaN if empty or any value not finite."""
    if not values or not all(math.isfinite(value) for value in values):
        return NAN
    mean = exact_mean(values)
    return exact_sum((value - mean) * (value - mean) for value in values) / len(values)


def exact_std(values: Sequence[float]) -> float:
    """``sqrt(var)``."""
    return math.sqrt(exact_var(values))


def nan_min(values: Sequence[float]) -> float:
    """``min`` that returns NaN when any value is NaN (Python's ``min`` does not)."""
    if not values or any(math.isnan(v) for v in values):
        return NAN
    return min(values)


def nan_max(values: Sequence[float]) -> float:
    """``max`` that returns NaN when any value is NaN (Python's ``max`` does not)."""
    if not values or any(math.isnan(v) for v in values):
        return NAN
    return max(values)


def delta(values: Sequence[float]) -> float:
    """``last - first``; NaN if any value in the window is NaN."""
    if not values or any(math.isnan(value) for value in values):
        return NAN
    return values[-1] - values[0]


def slope(steps: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against ``steps``; NaN if undefined or not finite."""
    if len(values) < 2 or not all(math.isfinite(value) for value in values):
        return NAN
    mean_x, mean_y = exact_mean(steps), exact_mean(values)
    sxx = exact_sum((x - mean_x) * (x - mean_x) for x in steps)
    if sxx == 0:
        return NAN
    sxy = exact_sum((x - mean_x) * (y - mean_y) for x, y in zip(steps, values, strict=True))
    return sxy / sxx


def zscore(values: Sequence[float]) -> float:
    """``(last - mean(previous)) / std(previous)``; NaN if that std is 0 or a value not finite."""
    if len(values) < 2 or not all(math.isfinite(value) for value in values):
        return NAN
    previous = values[:-1]
    std = exact_std(previous)
    if std == 0:
        return NAN
    return (values[-1] - exact_mean(previous)) / std


WindowFunction = Callable[[Sequence[float], Sequence[float]], float]  # (steps, values)

WINDOW_STATS: Final[Mapping[str, WindowFunction]] = MappingProxyType(
    {
        "mean": lambda steps, values: exact_mean(values),
        "std": lambda steps, values: exact_std(values),
        "var": lambda steps, values: exact_var(values),
        "min": lambda steps, values: nan_min(values),
        "max": lambda steps, values: nan_max(values),
        "delta": lambda steps, values: delta(values),
        "slope": slope,
        "zscore": lambda steps, values: zscore(values),
    }
)
"""The statistics of ``over_steps`` by name, each taking (steps, values) of the window."""
