"""Errors raised by the codec."""

from __future__ import annotations

from enum import StrEnum

from rlpulse.exceptions import RlpulseError


class DecodeFailure(StrEnum):
    """What was wrong with bytes that could not be decoded."""

    GARBAGE = "garbage"
    TRUNCATED = "truncated"
    UNKNOWN_FINGERPRINT = "unknown_fingerprint"
    WRONG_RECORD = "wrong_record"


class SchemaError(RlpulseError):
    """Root of the errors raised by ``rlpulse.schemas``."""


class DecodeError(SchemaError, ValueError):
    """Bytes that are not a decodable single-object-encoded record; ``failure`` says why."""

    def __init__(self, failure: DecodeFailure, detail: str) -> None:
        super().__init__(f"{failure.value}: {detail}")
        self.failure = failure
        self.detail = detail


class EncodeError(SchemaError, ValueError):
    """A record that does not match its schema."""
