"""Errors raised by ``rlpulse.producers``.

Transport trouble (broker down, local queue full) is never raised from ``log()``;
these errors are for mistakes of the caller: a wrong value, a bad client setting,
or use after ``close()``.
"""

from __future__ import annotations

from collections.abc import Sequence


class ProducerError(Exception):
    """Root of the errors raised by ``rlpulse.producers``."""


class InvalidFieldError(ProducerError, TypeError):
    """A value of the wrong type, such as a non-numeric metric; names the field and key."""

    def __init__(self, field: str, key: str | None, value: object, expected: str) -> None:
        where = field if key is None else f"{field}[{key!r}]"
        super().__init__(f"{where} is {type(value).__name__} ({value!r:.80}); expected {expected}")
        self.field = field
        self.key = key
        self.value = value
        self.expected = expected


class InvalidValueError(ProducerError, ValueError):
    """A value of the right type that is not allowed; lists the valid choices when there are."""

    def __init__(self, field: str, value: object, choices: Sequence[str] | str) -> None:
        wanted = choices if isinstance(choices, str) else "one of " + ", ".join(map(repr, choices))
        super().__init__(f"{field}={value!r} is not allowed; expected {wanted}")
        self.field = field
        self.value = value
        self.choices = choices


class ProducerConfigError(ProducerError, ValueError):
    """librdkafka refused the client configuration (often a key in ``ProducerConfig.extra``)."""


class ProducerClosedError(ProducerError, RuntimeError):
    """A logger, control client or run link was used after ``close()``."""
