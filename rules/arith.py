"""Exact reductions shared by the step joiner, the rule evaluator and the backtest.

DESIGN.md fixes the arithmetic so that every component computes bit-identical
values: ``mean = fsum(x) / n``, ``var = fsum((x - mean) ** 2) / n`` (population),
``std = sqrt(var)``. Any NaN input gives NaN; for ``var``/``std``/``zscore``/``slope``
any infinite input gives NaN as well; ``sum``/``mean``/``min``/``max`` follow IEEE
arithmetic for infinities (``inf + -inf`` is NaN).

``math.fsum`` raises where the exact sum of finite values leaves the float range;
there the sum is +-inf (what IEEE addition gives), and a mean — whose true value is
representable — is computed as ``fsum(x / n)`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

NAN = float("nan")


def exact_sum(values: Sequence[float]) -> float:
    """Correctly rounded sum; NaN if any value is NaN or infinities of both signs meet."""
    try:
        return math.fsum(values)
    except ValueError:  # fsum refuses inf + -inf; IEEE says NaN
        return NAN
    except OverflowError:  # the exact sum of finite values overflows: IEEE gives +-inf
        return float(sum(values))


def exact_mean(values: Sequence[float]) -> float:
    """``fsum(values) / n``; NaN for an empty sequence."""
    n = len(values)
    if not n:
        return NAN
    try:
        return math.fsum(values) / n
    except ValueError:
        return NAN
    except OverflowError:
        return math.fsum(v / n for v in values)


def exact_var(values: Sequence[float]) -> float:
    """Return the population variance; NaN if empty or if any value is not finite."""
    if not values or not all(math.isfinite(v) for v in values):
        return NAN
    mean = exact_mean(values)
    return exact_sum([(v - mean) * (v - mean) for v in values]) / len(values)


def exact_std(values: Sequence[float]) -> float:
    """Square root of :func:`exact_var`."""
    return math.sqrt(exact_var(values)) if values else NAN


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


def slope(steps: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against ``steps``; NaN if undefined or not finite."""
    n = len(values)
    if n < 2 or len(steps) != n or not all(math.isfinite(v) for v in values):
        return NAN
    mean_x = exact_mean(steps)
    mean_y = exact_mean(values)
    sxx = exact_sum([(x - mean_x) * (x - mean_x) for x in steps])
    if sxx == 0:
        return NAN
    sxy = exact_sum([(x - mean_x) * (y - mean_y) for x, y in zip(steps, values, strict=True)])
    return sxy / sxx


def zscore(values: Sequence[float]) -> float:
    """``(last - mean(previous)) / std(previous)``; NaN if that std is 0 or an input not finite."""
    if len(values) < 2:
        return NAN
    previous = values[:-1]
    std = exact_std(previous)
    if not math.isfinite(values[-1]) or math.isnan(std) or std == 0:
        return NAN
    return (values[-1] - exact_mean(previous)) / std
