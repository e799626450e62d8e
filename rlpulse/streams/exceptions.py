"""The root of the errors raised by ``rlpulse.streams`` and its processes."""

from __future__ import annotations

from rlpulse.exceptions import RlpulseError

__all__ = ["StreamsError"]


class StreamsError(RlpulseError):
    """A stream process (worker, exporter, archiver, indexer) cannot start or go on."""
