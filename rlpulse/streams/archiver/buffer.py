"""The records one partition delivered since its last flush, grouped by date and run.

Rows arrive as dicts, or as the :class:`~rlpulse.archive.tables.BatchRows` of a
batch message; every :data:`BATCH_ROWS` rows of a group become one Arrow record batch,
built column by column over all of them, so a buffer holds compact columns rather than
Python objects. :meth:`flush_plan`
turns the buffer into the files of one flush (see :mod:`rlpulse.archive.layout`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa

from rlpulse.archive.layout import FileName, relative_path
from rlpulse.archive.tables import (
    BatchColumns,
    BatchRows,
    Rows,
    Table,
    day_of,
    run_partition,
)

__all__ = ["BATCH_ENTRIES", "BATCH_ROWS", "PartitionBuffer", "PlannedFile"]

BATCH_ROWS: Final = 4096
BATCH_ENTRIES: Final = 4096
"""Batch messages' records gathered (as column lists) before they become an Arrow batch."""
MS_PER_DAY: Final = 86_400_000


@dataclass
class _Group:
    rows: list[dict[str, Any]] = field(default_factory=list)
    """Dict rows not yet in :attr:`batches`."""
    pending: BatchColumns | None = None
    """Batch messages' rows not yet in :attr:`batches` (never together with :attr:`rows`)."""
    batches: list[pa.RecordBatch] = field(default_factory=list)
    newest_ms: int = -1


@dataclass(frozen=True)
class PlannedFile:
    """One file of a flush: where it goes and what it holds."""

    relative: str
    name: FileName
    table: pa.Table


class PartitionBuffer:
    """What one partition of one table delivered since its last flush (offsets ``first..last``).

    ``started`` is when its first record arrived (monotonic seconds), for rolling by time.
    """

    def __init__(self, table: Table, partition: int, started: float) -> None:
        self.table = table
        self.partition = partition
        self.started = started
        self.first: int | None = None
        self.last: int | None = None
        self.records = 0
        self.bytes = 0
        """The records' message sizes, summed: what ``roll_bytes`` is compared with."""
        self._struct = pa.struct(list(table.schema))
        self._groups: dict[tuple[int, str | None], _Group] = {}
        """Rows by (UTC day number, run id)."""

    def add(self, rows: Rows, run: str | None, offset: int, size: int, stamp_ms: int) -> None:
        """Add the rows of the message at ``offset`` (``size`` bytes, from ``stamp_ms``)."""
        if self.first is None:
            self.first = offset
        self.last = offset
        self.bytes += size
        key = (stamp_ms // MS_PER_DAY, run)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group()
        if stamp_ms > group.newest_ms:  # noqa: PLR1730 -- cheaper than max() per row
            group.newest_ms = stamp_ms
        if isinstance(rows, BatchRows):
            self.records += len(rows.entries)
            if group.rows:  # keep the order: the rows before these become a batch first
                self._convert(group)
            if group.pending is None:
                group.pending = BatchColumns(self.table.schema)
            group.pending.add(rows)
            if group.pending.rows >= BATCH_ENTRIES:
                self._convert(group)
            return
        self.records += len(rows)
        if group.pending is not None:
            self._convert(group)
        group.rows += rows
        if len(group.rows) >= BATCH_ROWS:
            self._convert(group)

    def _convert(self, group: _Group) -> None:
        """Turn what the group holds as Python objects into one Arrow record batch."""
        if group.pending is not None:
            if group.pending.rows:
                group.batches.append(group.pending.record_batch())
            group.pending = None
        if group.rows:
            # pa.array of a struct type converts dicts about ten times faster than from_pylist.
            columns = pa.array(group.rows, type=self._struct)
            group.batches.append(pa.RecordBatch.from_struct_array(columns))
            group.rows = []

    def flush_plan(self) -> list[PlannedFile]:
        """The files of this buffer's flush, one per (date, run), in a fixed order."""
        if self.first is None or self.last is None:
            return []
        keys = sorted(self._groups, key=lambda key: (key[0], key[1] or ""))
        planned = []
        for index, key in enumerate(keys):
            group = self._groups[key]
            self._convert(group)
            batches = group.batches
            name = FileName(
                self.partition, self.first, self.last, index, len(keys), group.newest_ms
            )
            day, run = key
            planned.append(
                PlannedFile(
                    relative_path(
                        self.table.topic, day_of(day * MS_PER_DAY), run_partition(run), name
                    ),
                    name,
                    pa.Table.from_batches(batches, schema=self.table.schema),
                )
            )
        return planned
