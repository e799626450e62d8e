"""What a worker says after each rebalance: the events partitions it holds, in one line.

Several workers with one prefix share the runs through one consumer group; without a word
from them an operator cannot tell which runs a worker serves, or that a worker got nothing
(more workers than ``worker.partitions``) and idles. After each rebalance every worker says,
where its start-up lines go (stderr, whatever ``worker.log_level`` is;
:func:`rlpulse.streams.worker.run.say_while_running`)::

    holding events partitions 0, 2, 4 of 6 (group rlpulse-worker, 2 members)
    holding no events partition: the group rlpulse-worker has 7 members for 6 partitions; more
    workers than `worker.partitions` stay idle

(the second is one line). The partitions come from faust's ``on_partitions_assigned``
signal; the member count from one DescribeGroups request on the consumer's own connection,
asked after the rebalance, never inside it (a rebalance is never slowed by the line). When
the count does not come within :data:`MEMBERS_TIMEOUT_S` the line leaves it out; when a newer
rebalance comes first, only the newer one is said.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import faust
from faust.types import TP

__all__ = ["MEMBERS_TIMEOUT_S", "HeldPartitionsLine", "held_line"]

log = logging.getLogger(__name__)

MEMBERS_TIMEOUT_S: Final = 5.0
"""How long the line waits for the group's member count before it is said without it."""


def held_line(held: Iterable[int], partitions: int, group: str, members: int | None) -> str:
    """The line a worker says about the events partitions it holds after a rebalance."""
    chosen = sorted(set(held))
    count = "" if members is None else f", {_counted(members, 'member')}"
    if chosen:
        word = "partition" if len(chosen) == 1 else "partitions"
        listed = ", ".join(map(str, chosen))
        return f"holding events {word} {listed} of {partitions} (group {group}{count})"
    if members is not None and members > partitions:
        return (
            f"holding no events partition: the group {group} has {members} members for "
            f"{_counted(partitions, 'partition')}; more workers than `worker.partitions` stay idle"
        )
    return f"holding no events partition of {partitions} (group {group}{count})"


def _counted(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


class HeldPartitionsLine:
    """Says :func:`held_line` once per rebalance (:meth:`attach` it to the app)."""

    def __init__(
        self,
        events_topic: str,
        partitions: int,
        group: str,
        say: Callable[[str], None],
        members: Callable[[], Awaitable[int | None]],
        members_timeout_s: float = MEMBERS_TIMEOUT_S,
    ) -> None:
        self.events_topic = events_topic
        self.partitions = partitions
        self.group = group
        self._say = say
        self._members = members
        self._members_timeout_s = members_timeout_s
        self._rebalances = 0
        self._pending: set[asyncio.Task[None]] = set()

    def attach(self, app: faust.App) -> None:
        """Say the line after each of ``app``'s rebalances."""
        app.on_partitions_assigned.connect(self.on_assigned)

    async def on_assigned(self, sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        """Receive faust's signal (``args``: the assigned partitions); say the line soon after."""
        assigned: set[TP] = args[0]
        held = [tp.partition for tp in assigned if tp.topic == self.events_topic]
        self._rebalances += 1
        task = asyncio.ensure_future(self._announce(self._rebalances, held))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _announce(self, rebalance: int, held: list[int]) -> None:
        members: int | None = None
        try:
            members = await asyncio.wait_for(self._members(), self._members_timeout_s)
        except Exception as exc:  # the line is said without the count
            log.debug("the group's member count did not come: %r", exc)
        if rebalance == self._rebalances:  # else a newer rebalance says its own line
            self._say(held_line(held, self.partitions, self.group, members))
