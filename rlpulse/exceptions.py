"""The root of every error rlpulse raises on purpose.

Each package has its own ``exceptions`` module whose base class derives from
:class:`RlpulseError` (``SchemaError``, ``ProducerError``, ``RulesError``, ``StreamsError``,
``TransportError``, ``OpsError``, ``SettingsError``, ``LocalError``), so
``except RlpulseError`` catches everything rlpulse means to raise and nothing else. Where a
built-in says the same (a ``ValueError`` for a bad value, a ``TimeoutError`` for a
deadline), the class derives from that too. The command line prints an ``RlpulseError`` as
one sentence and exits non-zero.
"""

from __future__ import annotations

__all__ = ["RlpulseError", "SettingsError"]


class RlpulseError(Exception):
    """Root of the errors raised by rlpulse."""


class SettingsError(RlpulseError, ValueError):
    """Settings that do not validate: from a flag, the environment or the config file."""
