"""rlpulse's own diagnostics: each kind of trouble once at WARNING, and always on stderr.

:class:`WarnOnce` logs the first report of a kind of trouble at WARNING, its repeats at
DEBUG. :func:`install` (run when a ``RunLink``, ``EventLogger``, ``EventHandler`` or the
CLI is built; ``import rlpulse`` changes no logging) gives the ``rlpulse`` logger a handler
of its own that writes WARNING and above to stderr. A trainer that puts an
:class:`~rlpulse.producers.EventHandler` on the root logger (as docs/logs.md shows) has
no other handler, so Python's last-resort printer stays silent, and the EventHandler
ignores rlpulse's own records (they would feed on themselves): without it the warnings
that say the pipeline is failing -- undeliverable records, refused events, a broker out of reach --
would reach nobody. Records still propagate to the program's handlers as before; the
stderr handler stays quiet for a record that a stream handler on stderr up the chain
prints anyway (``logging.basicConfig``, a worker's or exporter's log set-up), so nothing
is printed twice.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["LOGGER_NAME", "StderrDiagnostics", "WarnOnce", "install"]

LOGGER_NAME = "rlpulse"
"""The logger above all of rlpulse's own loggers."""


class StderrDiagnostics(logging.Handler):
    """Writes rlpulse's records to the current ``sys.stderr`` unless another handler does."""

    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        """Print ``record`` on stderr, unless a handler up the chain prints it there too."""
        if self._printed_elsewhere(record):
            return
        try:
            stream = sys.stderr
            if stream is None:  # pythonw: no console at all
                return
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)

    def _printed_elsewhere(self, record: logging.LogRecord) -> bool:
        """Whether a stream handler on stderr that ``record`` propagates to takes it."""
        consoles = {id(sys.stderr), id(sys.__stderr__)}
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            for handler in logger.handlers:
                if (
                    handler is not self
                    and isinstance(handler, logging.StreamHandler)
                    and id(handler.stream) in consoles
                    and record.levelno >= handler.level
                ):
                    return True
            logger = logger.parent if logger.propagate else None
        return False


def install() -> StderrDiagnostics:
    """Give the ``rlpulse`` logger its stderr handler (once; returns the one installed)."""
    logger = logging.getLogger(LOGGER_NAME)
    for handler in logger.handlers:
        if isinstance(handler, StderrDiagnostics):
            return handler
    handler = StderrDiagnostics()
    logger.addHandler(handler)
    return handler


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
