"""Picking the numbers out of a framework's metrics dict."""

from __future__ import annotations

from collections.abc import Mapping
from typing import SupportsFloat


def number(value: object) -> float | None:
    """``value`` as a float; None for strings, arrays and anything else that is not a scalar.

    Accepts what frameworks log: ints, floats, numpy scalars, one-element tensors.
    """
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, SupportsFloat):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # e.g. a tensor of several elements
        return None


def numeric_metrics(data: Mapping[str, object]) -> dict[str, float]:
    """The entries of ``data`` whose values are numbers, as floats (NaN and inf kept)."""
    found = ((name, number(value)) for name, value in data.items())
    return {name: value for name, value in found if value is not None}
