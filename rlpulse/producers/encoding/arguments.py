"""Checks of the arguments a training loop passes in: right type, right range, or an error.

These raise for mistakes in the caller's code (a string where a rank goes); what is wrong
with an event's contents is judged by :mod:`rlpulse.schemas.validation` instead, and
refused without an exception. ``EventLogger.log()`` turns what these raise into a refusal
too (:func:`bad_argument`), so that a training loop never stops for a bad value.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlpulse.producers.exceptions import InvalidFieldError, InvalidValueError
from rlpulse.schemas.validation import EventProblem

__all__ = [
    "INT_MAX",
    "LONG_MAX",
    "LONG_MIN",
    "bad_argument",
    "require_int",
    "require_run_id",
    "string_map",
]

LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


def require_run_id(run_id: object) -> str:
    """Return ``run_id`` after checking it is a non-empty str (it becomes the message key)."""
    if not isinstance(run_id, str):
        raise InvalidFieldError("run_id", None, run_id, "a non-empty str")
    if not run_id:
        raise InvalidValueError("run_id", run_id, "a non-empty str")
    return run_id


def require_int(field: str, value: object, minimum: int, maximum: int = INT_MAX) -> int:
    """Return ``value`` as an ``int`` (``__index__``, not bool) after checking the range.

    The default maximum is Avro's ``int``; pass :data:`LONG_MAX` for a ``long``.
    """
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidFieldError(field, None, value, "an int")
    number = int(value.__index__())
    if not minimum <= number <= maximum:
        raise InvalidValueError(field, number, f"an int in [{minimum}, {maximum}]")
    return number


def string_map(field: str, mapping: Mapping[str, str] | None) -> dict[str, str]:
    """Return a copy of ``mapping`` after checking that its keys and values are strings."""
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        raise InvalidFieldError(field, None, mapping, "a mapping of str to str")
    out: dict[str, str] = {}
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise InvalidFieldError(field, repr(key), key, "str keys")
        if not isinstance(value, str):
            raise InvalidFieldError(field, key, value, "a str value")
        out[key] = value
    return out


def bad_argument(error: InvalidFieldError | InvalidValueError) -> EventProblem:
    """The refusal of an event for ``error``: code ``<field>_type`` or ``<field>_value``."""
    suffix = "type" if isinstance(error, InvalidFieldError) else "value"
    return EventProblem("invalid", f"{error.field}_{suffix}", str(error))
