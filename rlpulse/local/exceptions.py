"""Errors raised by ``rlpulse.local``: the processes rlpulse runs on this machine."""

from __future__ import annotations

from rlpulse.exceptions import RlpulseError

__all__ = [
    "BrokerError",
    "ExporterProcessError",
    "LocalError",
    "S3ProxyError",
    "SearchError",
    "WorkerProcessError",
]


class LocalError(RlpulseError):
    """Root of the errors raised while running local processes."""


class BrokerError(LocalError):
    """The local Kafka broker could not be started, found or stopped."""


class WorkerProcessError(LocalError):
    """A worker child process exited early or did not join its consumer group in time."""


class ExporterProcessError(LocalError):
    """An exporter child process exited early or did not serve its lookback in time."""


class SearchError(LocalError):
    """The local OpenSearch node could not be started, found or stopped."""


class S3ProxyError(LocalError):
    """The local S3Proxy could not be started, or refused a request."""
