"""How a run attempt ends: one ``run_end``, from rank 0, saying why the run ended.

Several paths may end a run — the user's ``run_end``, a ``stop`` command's
``exit_if_stopped``, ``close()``, a framework callback (verl's ``finish``, the Trainer's
``on_train_end``) — and more than one of them usually runs. :class:`RunEnding` lets the first
one through and no other, and only on rank 0. The reason travels in the event's ``message``.
"""

from __future__ import annotations

import threading

from rlpulse.schemas.records import ControlCommand

__all__ = ["CLOSED", "FINISHED", "RunEnding", "exited", "stopped_by"]

FINISHED = "training finished"
"""The reason of a run that ran to its end (the default of ``run_end``)."""
CLOSED = "closed"
"""The reason of a run whose link was closed with no ``run_end`` sent and no ``stop`` received."""


def stopped_by(command: ControlCommand) -> str:
    """The reason of a run a ``stop`` command ended: ``stopped by command <id> (<rule>)``.

    ``<rule>`` is the rule id, or ``operator`` for an operator's command.
    """
    origin = command.get("rule_id") or command["origin"]
    return f"stopped by command {command['command_id']} ({origin})"


def exited(exit_code: int) -> str:
    """The reason of a run whose framework ended it with ``exit_code`` (0: :data:`FINISHED`)."""
    return FINISHED if exit_code == 0 else f"exited with code {exit_code}"


class RunEnding:
    """The one ``run_end`` a process of a run attempt may send: rank 0's first, none after.

    :meth:`claim` says whether the caller is the one to send it; :attr:`reason` is what the
    winner said (None until then, and always on ranks other than 0).
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._reason: str | None = None
        self._lock = threading.Lock()

    @property
    def reason(self) -> str | None:
        """The reason the run ended with, once rank 0 claimed its ``run_end``."""
        return self._reason

    @property
    def ended(self) -> bool:
        """Whether this process's ``run_end`` was claimed."""
        return self._reason is not None

    def claim(self, reason: str) -> bool:
        """True exactly once on rank 0, for the first caller: that caller sends ``run_end``."""
        if self.rank != 0:
            return False
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            return True
