"""Errors raised by ``rlpulse.streams.exporter``."""

from __future__ import annotations

from rlpulse.exceptions import RlpulseError

__all__ = ["ExporterError"]


class ExporterError(RlpulseError):
    """The exporter could not start: its port is taken, or its settings contradict each other."""
