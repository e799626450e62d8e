"""Errors raised by ``rlpulse.archive``."""

from __future__ import annotations

from rlpulse.exceptions import RlpulseError

__all__ = ["ArchiveError", "QueryError"]


class ArchiveError(RlpulseError):
    """The archive cannot be read or written (a bad root, a failing filesystem)."""


class QueryError(ArchiveError, ValueError):
    """A query over the archive failed: bad SQL, or a filter that cannot be understood."""
