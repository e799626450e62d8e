"""Log each kind of trouble once at WARNING, its repeats at DEBUG."""

from __future__ import annotations

import logging

__all__ = ["WarnOnce"]


class WarnOnce:
    """Logs each kind of trouble at WARNING the first time, at DEBUG afterwards.

    A broker that is down makes librdkafka and the delivery thread report the same
    trouble every few hundred milliseconds; one line says it, the rest wait at DEBUG.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[str] = set()

    def __call__(self, what: str, fmt: str, *args: object) -> None:
        """Log ``fmt % args``; ``what`` names the kind of trouble."""
        level = logging.DEBUG if what in self._seen else logging.WARNING
        self._seen.add(what)
        self._logger.log(level, fmt, *args)

    def seen(self, what: str) -> bool:
        """Whether ``what`` was logged already."""
        return what in self._seen
