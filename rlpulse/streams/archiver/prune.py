"""Retention: delete archive files whose newest record is older than the cutoff.

A file goes when its newest record (by Kafka timestamp, see
:mod:`rlpulse.archive.layout`) is older than ``retention_days``; the files of each
partition's newest flush stay, whatever their age, because they say where archiving
resumes. The archiver runs this every ``prune_interval_s``; ``rlpulse archive prune`` runs
it once. Safe to run while archivers write: it never touches the newest flush, and a flush
being written is newer than every file it could delete.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from rlpulse.archive.layout import newest_flushes
from rlpulse.archive.store import ArchiveStore

__all__ = ["PruneResult", "cutoff_ms", "prune"]

MS_PER_DAY = 86_400_000


@dataclass
class PruneResult:
    """What a prune deleted, and what it kept only because it is a newest flush."""

    deleted: list[str] = field(default_factory=list)
    kept_newest: list[str] = field(default_factory=list)


def cutoff_ms(now_ms: int, retention_days: float) -> int:
    """The time before which records are past their retention."""
    return now_ms - round(retention_days * MS_PER_DAY)


def prune(store: ArchiveStore, topics: Iterable[str], cutoff: int) -> PruneResult:
    """Delete the files of ``topics`` whose newest record is older than ``cutoff`` (ms)."""
    result = PruneResult()
    for topic in topics:
        files = store.files(topic)
        newest = set(newest_flushes(files).values())
        doomed = []
        for path, name in files:
            if name.newest_ms >= cutoff:
                continue
            if name.flush in newest:
                result.kept_newest.append(path)
            else:
                doomed.append(path)
        store.delete(doomed)
        result.deleted += doomed
    return result
