"""Errors raised by ``rlpulse.ui``."""

from __future__ import annotations

from rlpulse.exceptions import RlpulseError

__all__ = ["NotFoundError", "UiError"]


class UiError(RlpulseError):
    """The run page's server cannot start or answer."""


class NotFoundError(UiError, LookupError):
    """The run, stage or step asked for is not in the archive nor on the live topics."""
