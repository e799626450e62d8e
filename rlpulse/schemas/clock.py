"""A host's clock against the brokers': the header the host agent sends it in, and its reading.

The events and logs topics stamp each record with the broker's clock (``LogAppendTime``). The
host agent measures its host's offset from its own delivery reports and sends the estimate
with every message, in the :data:`CLOCK_HEADER` header: ``<offset ns>/<error ns>`` (ASCII),
where the offset is what to add to the host's ``timestamp_ns`` to get the brokers' clock and
the error bounds it (half the round trip of the delivery it comes from). The first messages
of an agent carry none (it has no estimate yet).

Readers order one step's records from several hosts by :func:`corrected_ns`, which is the
brokers' clock for all of them; the archive keeps the two numbers as the ``clock_offset_ns``
and ``clock_error_ns`` columns of its events and logs tables.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CLOCK_HEADER", "MAX_OFFSET_NS", "corrected_ns", "parse_clock_header"]

CLOCK_HEADER: Final = "rlpulse-clock"
"""Header of every message the agent sends once it has an estimate: ``<offset>/<error>`` in
nanoseconds; the offset is what to add to the host's timestamps to get the broker's clock."""
MAX_OFFSET_NS: Final = 2**62
"""The largest offset taken (146 years): a timestamp plus it still fits 64 bits, so SQL that
adds the two never overflows."""
_INT64: Final = 2**63


def corrected_ns(timestamp_ns: int, offset_ns: int | None) -> int:
    """A host's timestamp on the brokers' clock (unchanged when the offset is not known)."""
    return timestamp_ns if offset_ns is None else timestamp_ns + offset_ns


def parse_clock_header(value: bytes | str | None) -> tuple[int, int] | None:
    """``(offset ns, error ns)`` from a :data:`CLOCK_HEADER` value; None if absent or bad.

    An error left out (``"<offset>"``) reads as 0. Bad: anything but integers, a negative
    error, an error beyond a signed 64-bit integer (what the archive's columns hold), an
    offset beyond :data:`MAX_OFFSET_NS` either way.
    """
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    offset, _, error = text.partition("/")
    try:
        found = int(offset), int(error or 0)
    except ValueError:
        return None
    offset_ns, error_ns = found
    if not (-MAX_OFFSET_NS <= offset_ns <= MAX_OFFSET_NS and 0 <= error_ns < _INT64):
        return None
    return found
