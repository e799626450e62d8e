"""Picking the numbers out of a framework's metrics dict."""

from __future__ import annotations

from collections.abc import Mapping

from rlpulse.schemas.validation import metric_number


def numeric_metrics(data: Mapping[str, object]) -> dict[str, float]:
    """The entries of ``data`` whose values are numbers, as floats (NaN and inf kept).

    A number is what :func:`~rlpulse.schemas.validation.metric_number` takes: what frameworks
    log (ints, floats, numpy scalars, one-element tensors), not strings or arrays.
    """
    found = ((name, metric_number(value)) for name, value in data.items())
    return {name: value for name, value in found if value is not None}
