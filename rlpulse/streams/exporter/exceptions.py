"""Errors raised by ``rlpulse.streams.exporter``."""

from __future__ import annotations

from rlpulse.streams.exceptions import StreamsError

__all__ = ["ExporterError"]


class ExporterError(StreamsError):
    """The exporter could not start: its port is taken, or its settings contradict each other."""
