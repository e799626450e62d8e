"""Errors raised by ``rlpulse.transport``."""

from __future__ import annotations

from rlpulse.exceptions import RlpulseError

__all__ = [
    "BrokerUnavailableError",
    "ClientConfigError",
    "SecurityFailureError",
    "TopicError",
    "TransportError",
]


class TransportError(RlpulseError):
    """Root of the errors raised while talking to Kafka."""


class ClientConfigError(TransportError, ValueError):
    """librdkafka refused a client configuration (often a key in ``librdkafka``)."""


class BrokerUnavailableError(TransportError, TimeoutError):
    """Kafka did not answer, or its topics had no leaders, before a deadline."""


class TopicError(TransportError):
    """A topic could not be created, or exists with the wrong shape."""


class SecurityFailureError(TransportError, PermissionError):
    """Kafka refused the credentials, or TLS could not verify the broker: retrying cannot help."""
