"""Ranks grouped by where their training loops are: the stacks of a capture, read.

A capture (``capture_stacks``) brings one record per rank
(:mod:`rlpulse.schemas.stacks`): the rank's threads, its training loop first. In a hang most
ranks wait in the same collective while a few are somewhere else; :func:`group_ranks` groups
the ranks by the innermost frame of their training loop and names, for each group, the
innermost frame in the user's own code (not the standard library's or an installed
package's), the smallest group first: ``1 rank in wait threading.py:629, from next_batch
data.py:88 (2)`` then ``3 ranks in all_reduce distributed_c10d.py:2806, from step
train.py:40 (0, 1, 3)``. Ranks without stacks (their process gone, or silent) are groups of
their own. :data:`CAPTURE_QUERY` and :func:`newest_capture` read a run's newest capture from
the archive (``rlpulse show RUN --stacks``, the run page).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from rlpulse.archive.tables import run_partition
from rlpulse.rules.silence import SILENCE_WORDS
from rlpulse.schemas.stacks import STACKS_LOGGER, RankStacks, parse_dump

__all__ = [
    "CAPTURE_QUERY",
    "SILENCE_WORDS",
    "StackGroup",
    "capture_parameters",
    "describe_groups",
    "frame_label",
    "group_ranks",
    "newest_capture",
]

_FRAME = re.compile(r'^File "(?P<path>[^"]*)", line (?P<line>\d+) in (?P<function>.*)$')
_LIBRARY: Final = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")


@dataclass(frozen=True)
class StackGroup:
    """Ranks whose training loops are in the same place (or share an outcome)."""

    where: str  # ``all_reduce distributed_c10d.py:2806``, or ``process gone``
    called_from: str | None  # the innermost frame of the user's code, if another
    ranks: tuple[int, ...]


def frame_label(frame: str) -> str:
    """``File "/x/train.py", line 88 in step`` -> ``step train.py:88``."""
    found = _FRAME.match(frame.strip())
    if found is None:
        return frame.strip()
    name = found["path"].rsplit("/", 1)[-1]
    return f"{found['function']} {name}:{found['line']}"


def _users(frame: str) -> bool:
    found = _FRAME.match(frame.strip())
    return found is not None and not any(part in found["path"] for part in _LIBRARY)


def group_ranks(ranks: Iterable[RankStacks]) -> list[StackGroup]:
    """The ranks grouped by their training loop's innermost frame, smallest group first."""
    groups: dict[tuple[str, str | None], list[int]] = {}
    for rank in ranks:
        if rank.outcome != "stacks":
            key: tuple[str, str | None] = (f"process {rank.outcome}", None)
        else:
            threads = parse_dump(rank.dump)
            frames = threads[0].frames if threads else ()
            where = frame_label(frames[0]) if frames else "<no Python frame>"
            own = next((frame for frame in frames if _users(frame)), None)
            called = frame_label(own) if own is not None and own != frames[0] else None
            key = (where, called)
        groups.setdefault(key, []).append(rank.rank)
    found = [
        StackGroup(where, called, tuple(sorted(ranks))) for (where, called), ranks in groups.items()
    ]
    return sorted(found, key=lambda group: (len(group.ranks), group.ranks))


def describe_groups(groups: Sequence[StackGroup], shown: int = 8) -> list[str]:
    """One line per group: ``1 rank in f train.py:88, from g main.py:12 (2)``."""
    lines = []
    for group in groups:
        count = len(group.ranks)
        noun = "rank" if count == 1 else "ranks"
        ranks = ", ".join(str(rank) for rank in group.ranks[:shown])
        if count > shown:
            ranks += f", ... {count - shown} more"
        where = group.where if group.where.startswith("process ") else f"in {group.where}"
        if group.called_from is not None:
            where += f", from {group.called_from}"
        lines.append(f"{count:,} {noun} {where} ({ranks})")
    return lines


CAPTURE_QUERY: Final = (
    "SELECT fields['command_id'] AS command_id, rank, fields['outcome'] AS outcome, step, "
    "hostname, pid, message FROM logs WHERE run = ? AND run_id = ? AND logger = ? "
    "ORDER BY timestamp_ns"
)
"""The stack records of a run in the archive (parameters: :func:`capture_parameters`)."""


def capture_parameters(run_id: str) -> list[Any]:
    """The parameters of :data:`CAPTURE_QUERY` for ``run_id``."""
    return [run_partition(run_id), run_id, STACKS_LOGGER]


def newest_capture(rows: Sequence[Mapping[str, Any]]) -> tuple[str, list[RankStacks]] | None:
    """The newest capture among :data:`CAPTURE_QUERY`'s rows.

    Its command id and the ranks' records; None when there is no row.
    """
    if not rows:
        return None
    newest = rows[-1]["command_id"]
    found: dict[tuple[str, int, int], RankStacks] = {}
    for row in rows:
        if row["command_id"] != newest:
            continue
        outcome = row["outcome"] or "stacks"
        dump = row["message"] if outcome == "stacks" else ""
        key = (row["hostname"], row["pid"], row["rank"])
        found[key] = RankStacks(
            row["rank"], outcome, row["step"], row["hostname"], row["pid"], dump
        )
    return newest, sorted(found.values(), key=lambda each: (each.rank, each.host, each.pid))
