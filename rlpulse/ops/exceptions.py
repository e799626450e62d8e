"""Errors raised by ``rlpulse.ops``."""

from __future__ import annotations

from rlpulse.exceptions import RlpulseError

__all__ = ["OpsError", "PublishError"]


class OpsError(RlpulseError):
    """Root of the errors raised while acting on a deployment."""


class PublishError(OpsError, TimeoutError):
    """A record was not confirmed by the broker in time (or was refused)."""
