"""Which offsets of each partition a worker has read, and what to do about gaps.

rlpulse's topics are written without transactions and never compacted, so the offsets of a
partition are contiguous: a delivered offset beyond the next one expected means messages
were skipped. faust was seen doing that after a restart (a range of a partition was never
delivered, yet its offsets were committed). :class:`ReadTracker` turns each delivery into a
verdict: process it, skip it (an older buffered delivery after a rewind), or seek back to
the first missing offset. It also keeps the stall watchdog's count: for how many ticks in a
row a partition with unread messages has delivered nothing. A pure object; the agents
perform the seeks.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum

__all__ = ["ReadTracker", "Verdict"]


class Verdict(Enum):
    """What an agent does with one delivered message."""

    PROCESS = "process"
    SKIP = "skip"
    SEEK = "seek"


@dataclass
class _Rewind:
    to: int  # the first missing offset, sought back to
    gap_at: int  # the offset delivered after the gap
    skipped: int = 0


class ReadTracker:
    """Per partition: the next offset wanted, and a pending rewind after a gap.

    ``max_skip`` bounds a rewind: if the missing offsets never come (a gap that is real, for
    example transaction markers written by a foreign producer), the tracker gives up after
    skipping that many deliveries and reads on from where it is. ``min_tick_gap_s``: watchdog
    ticks closer together than this (a backlog of ticks read in a burst after a takeover)
    count as one, so a stall is a stretch of time, not of tick messages.
    """

    def __init__(self, max_skip: int = 10_000, min_tick_gap_s: float = 0.0) -> None:
        self.max_skip = max_skip
        self.min_tick_gap_s = min_tick_gap_s
        self._counted_at: dict[Hashable, float] = {}
        self._next: dict[Hashable, int] = {}
        self._rewinds: dict[Hashable, _Rewind] = {}
        self._sought: set[tuple[Hashable, int]] = set()
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

    def seek_target(self, tp: Hashable) -> int:
        """The offset to seek ``tp`` back to after a ``SEEK`` verdict."""
        return self._rewinds[tp].to

    def delivered(self, tp: Hashable, offset: int) -> Verdict:
        """The verdict for a delivery of ``offset`` from ``tp``."""
        rewind = self._rewinds.get(tp)
        if rewind is not None:
            if rewind.to <= offset < rewind.gap_at:  # the re-read has begun
                del self._rewinds[tp]
            else:
                rewind.skipped += 1
                if rewind.skipped <= self.max_skip:
                    return Verdict.SKIP
                del self._rewinds[tp]  # the missing offsets never came: read on
        wanted = self._next.get(tp)
        if wanted is not None and offset > wanted and (tp, wanted) not in self._sought:
            self._sought.add((tp, wanted))
            self._rewinds[tp] = _Rewind(to=wanted, gap_at=offset)
            return Verdict.SEEK
        self._next[tp] = offset + 1 if wanted is None else max(wanted, offset + 1)
        return Verdict.PROCESS

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
        self._rewinds.clear()
        self._sought.clear()
        self._stalls.clear()
        self._counted_at.clear()
