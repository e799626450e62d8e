"""The operator's side of ``rlpulse control stacks``: the stack records of one capture.

:class:`StackWatch` reads the logs topic from its end (opened before the command is
published) for the records the run's host agents send (:mod:`rlpulse.schemas.stacks`).
"""

from __future__ import annotations

import time
from typing import Final

from rlpulse.ops.acks import TopicWatch
from rlpulse.schemas.exceptions import DecodeError
from rlpulse.schemas.stacks import STACKS_LOGGER, RankStacks
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings

__all__ = ["StackWatch"]

_QUIET_S: Final = 2.0


class StackWatch(TopicWatch):
    """Reads the logs topic from its current end for the stack records of one command."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, Topics(settings.prefix).logs, "so no agent can send stacks")

    def collect(self, command_id: str, timeout_s: float) -> list[RankStacks]:
        """The ranks' records of ``command_id``.

        Waits up to ``timeout_s`` for the first, then until none came for 2 s (each agent
        sends its host's at once).
        """
        found: dict[tuple[str, int, int], RankStacks] = {}
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            before = len(found)
            for value in self.values(min(left, _QUIET_S) if found else min(left, 0.5)):
                self._take(value, command_id, found)
            if found and len(found) == before:
                break
        return sorted(found.values(), key=lambda rank: (rank.rank, rank.host, rank.pid))

    def _take(
        self, value: bytes, command_id: str, found: dict[tuple[str, int, int], RankStacks]
    ) -> None:
        try:
            batch = self._codec.decode_log_batch(value)
        except DecodeError:
            return
        for entry in batch["entries"]:
            fields = entry["fields"]
            if entry["logger"] != STACKS_LOGGER or fields.get("command_id") != command_id:
                continue
            outcome = fields.get("outcome", "stacks")
            found[(batch["hostname"], batch["pid"], batch["rank"])] = RankStacks(
                batch["rank"],
                outcome,
                entry["step"],
                batch["hostname"],
                batch["pid"],
                entry["message"] if outcome == "stacks" else "",
            )
