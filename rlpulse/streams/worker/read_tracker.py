"""Which offsets of each partition a worker has read, and which it was never handed.

rlpulse's topics are written without transactions and never compacted, so the offsets of a
partition are contiguous: a delivered offset beyond the next one expected means faust left
messages out (seen around rebalances: see :mod:`.gap_reader`). :class:`ReadTracker` answers,
for each delivery, which offsets before it are missing; the agent reads those itself before
it processes the delivery. It also keeps the stall watchdog's count: for how many ticks in a
row a partition with unread messages has delivered nothing. A pure object.
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["ReadTracker"]


class ReadTracker:
    """Per partition: the next offset wanted, and the stall watchdog's count.

    ``min_tick_gap_s``: watchdog ticks closer together than this (a backlog of ticks read in
    a burst after a takeover) count as one, so a stall is a stretch of time, not of tick
    messages.
    """

    def __init__(self, min_tick_gap_s: float = 0.0) -> None:
        self.min_tick_gap_s = min_tick_gap_s
        self._counted_at: dict[Hashable, float] = {}
        self._next: dict[Hashable, int] = {}
        self._stalls: dict[Hashable, tuple[int, int]] = {}  # tp -> (wanted offset, ticks)

    def next_offset(self, tp: Hashable) -> int | None:
        """The next offset wanted from ``tp``, or None before its first delivery."""
        return self._next.get(tp)

    def expect(self, tp: Hashable, offset: int) -> None:
        """Set where reading ``tp`` should start, before its first delivery.

        At a takeover: the committed offset. A first delivery beyond it is then a gap like any
        other.
        """
        self._next.setdefault(tp, offset)

    def delivered(self, tp: Hashable, offset: int) -> range:
        """The offsets of ``tp`` missing before a delivery of ``offset`` (empty: none).

        The caller reads them itself before it processes ``offset``; the next offset wanted
        is then past ``offset`` either way. A delivery from before the next one wanted (read
        again after a seek) misses nothing.
        """
        wanted = self._next.get(tp)
        self._next[tp] = offset + 1 if wanted is None else max(wanted, offset + 1)
        return range(0) if wanted is None else range(wanted, offset)

    def stalled_ticks(self, tp: Hashable, wanted: int | None, unread: int, now: float = 0.0) -> int:
        """Count one watchdog tick on ``tp``: for how many ticks in a row it has not moved.

        ``wanted`` is the next offset wanted from ``tp`` now and ``unread`` how many messages
        lie beyond it. 0 when the wanted offset moved since the last tick or nothing is unread.
        A tick within ``min_tick_gap_s`` (by ``now``, monotonic seconds) of the last one
        counted does not count again.
        """
        if wanted is None or unread <= 0:
            self._stalls.pop(tp, None)
            return 0
        since, ticks = self._stalls.get(tp, (wanted, -1))
        if since == wanted and ticks >= 0 and now - self._counted_at[tp] < self.min_tick_gap_s:
            return ticks
        ticks = ticks + 1 if since == wanted else 0
        self._stalls[tp] = (wanted, ticks)
        self._counted_at[tp] = now
        return ticks

    def rewound(self, tp: Hashable) -> None:
        """The agent sought ``tp`` back after a stall: its stall count starts over."""
        self._stalls.pop(tp, None)

    def forget(self) -> None:
        """Drop everything (the partitions were revoked; whoever reads them next starts over)."""
        self._next.clear()
        self._stalls.clear()
        self._counted_at.clear()
