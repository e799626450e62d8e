"""Where archived records live, and what the file names say about where archiving resumes.

::

    <root>/<topic>/date=<YYYY-MM-DD>/run=<run id>/<P>-<first>-<last>-<i>of<n>-<newest>.parquet

One *flush* writes the records a partition ``P`` delivered from offset ``first`` to
``last`` (inclusive), split by date and run into ``n`` files, numbered ``i`` = 0..n-1;
``newest`` is the latest Kafka timestamp in the file (milliseconds), which retention goes
by. Queries by run and date read only the directories they need (hive partitioning), and
the file names alone say how far each partition was archived:

- every flush of a partition starts where the previous one ended, so the partition
  resumes after the ``last`` of its newest flush;
- a crash can leave only the newest flush incomplete (fewer than ``n`` of its files): those
  files are deleted and the partition resumes at its ``first``, so the records are written
  again, once;
- retention never deletes a file of a partition's newest flush (it is what says where to
  resume), and temporary files start with ``.``, which readers ignore.

Pure: names in, decisions out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from rlpulse.archive.tables import quote_partition

__all__ = ["FileName", "Resume", "newest_flushes", "plan_resume", "relative_path"]

_NAME: Final = re.compile(
    r"^(?P<partition>\d+)-(?P<first>\d+)-(?P<last>\d+)-(?P<index>\d+)of(?P<count>\d+)"
    r"-(?P<newest>-?\d+)\.parquet$"
)
TEMP_PREFIX: Final = ".tmp-"


@dataclass(frozen=True, order=True)
class FileName:
    """What an archive file's name says."""

    partition: int
    first: int
    last: int
    index: int
    count: int
    newest_ms: int

    def __str__(self) -> str:
        return (
            f"{self.partition:05d}-{self.first:020d}-{self.last:020d}-"
            f"{self.index:03d}of{self.count:03d}-{self.newest_ms}.parquet"
        )

    @property
    def flush(self) -> tuple[int, int, int]:
        """The flush this file belongs to: (partition, first, last)."""
        return (self.partition, self.first, self.last)

    @classmethod
    def parse(cls, name: str) -> FileName | None:
        """The parts of an archive file name, or None for any other name."""
        found = _NAME.match(name)
        if found is None:
            return None
        return cls(
            int(found["partition"]),
            int(found["first"]),
            int(found["last"]),
            int(found["index"]),
            int(found["count"]),
            int(found["newest"]),
        )


def relative_path(topic: str, date: str, run: str, name: FileName | str) -> str:
    """The path of a file under the archive root."""
    return f"{topic}/date={date}/run={quote_partition(run)}/{name}"


@dataclass
class Resume:
    """Where one partition resumes, and what to delete first."""

    next_offset: int | None
    """The first offset not archived; None: nothing archived, start at the beginning."""
    incomplete: list[str] = field(default_factory=list)
    """Files of an unfinished flush (a crash), to delete before resuming."""


def newest_flushes(files: Iterable[tuple[str, FileName]]) -> dict[int, tuple[int, int, int]]:
    """The newest flush of each partition (by its last offset)."""
    newest: dict[int, tuple[int, int, int]] = {}
    for _path, name in files:
        known = newest.get(name.partition)
        if known is None or name.last > known[2]:
            newest[name.partition] = name.flush
    return newest


def plan_resume(files: Iterable[tuple[str, FileName]], partition: int) -> Resume:
    """Where ``partition`` resumes, given the archive files of its topic."""
    mine = [(path, name) for path, name in files if name.partition == partition]
    if not mine:
        return Resume(None)
    newest = newest_flushes(mine)[partition]
    members = [(path, name) for path, name in mine if name.flush == newest]
    if len({name.index for _, name in members}) >= members[0][1].count:
        return Resume(newest[2] + 1)
    earlier = [name.last for _, name in mine if name.flush != newest]
    resume = Resume(newest[1], [path for path, _ in members])
    if earlier and max(earlier) + 1 != newest[1]:  # cannot happen without a bug or a zombie
        resume.next_offset = max(earlier) + 1
    return resume
