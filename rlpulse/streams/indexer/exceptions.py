"""Errors raised by ``rlpulse.streams.indexer``."""

from __future__ import annotations

from rlpulse.exceptions import RlpulseError

__all__ = ["IndexerError"]


class IndexerError(RlpulseError):
    """The indexer cannot go on: no search engine, or one that refuses it."""
