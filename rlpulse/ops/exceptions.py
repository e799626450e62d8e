"""Errors raised by ``rlpulse.ops``."""

from __future__ import annotations

from rlpulse.exceptions import RlpulseError

__all__ = ["AckWaitError", "OpsError", "PublishError", "RulesTooLargeError"]


class OpsError(RlpulseError):
    """Root of the errors raised while acting on a deployment."""


class PublishError(OpsError, TimeoutError):
    """A record was not confirmed by the broker in time (or was refused)."""


class RulesTooLargeError(OpsError, ValueError):
    """A rules file larger than the workers accept (``worker.rules_max_bytes``)."""


class AckWaitError(OpsError):
    """The acks topic cannot be read, so a command's answer cannot be waited for."""
