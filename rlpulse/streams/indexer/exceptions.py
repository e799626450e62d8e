"""Errors raised by ``rlpulse.streams.indexer``."""

from __future__ import annotations

from rlpulse.streams.exceptions import StreamsError

__all__ = ["IndexerError"]


class IndexerError(StreamsError):
    """The indexer cannot go on: no search engine, or one that refuses it."""
