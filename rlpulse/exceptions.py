"""Errors raised by the rlpulse command line and local services."""


class RlpulseError(Exception):
    """Root of the errors the CLI reports as one sentence and a non-zero exit."""


class BrokerError(RlpulseError):
    """The local Kafka broker could not be started, found or stopped."""
