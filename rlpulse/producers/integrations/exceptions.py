"""Errors raised by ``rlpulse.producers.integrations``."""

from __future__ import annotations

from rlpulse.producers.exceptions import ProducerError


class IntegrationError(ProducerError):
    """Root of the errors raised by the framework integrations."""


class ActionRejectedError(IntegrationError):
    """An action this trainer cannot apply; the message is the reason sent in the ack."""


class VerlSettingsError(IntegrationError, ValueError):
    """The ``rlpulse`` block of a verl config is invalid; names the key and what is wrong."""
