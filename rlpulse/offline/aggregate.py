"""``rlpulse aggregate``: merge the per-rank JSON Lines of a run into one table-like view.

Every line of ``<component>_rank<N>.jsonl`` (read with :mod:`rlpulse.schemas.jsonl`,
``rank`` filled in from the file name) goes to the row of its merge key, by default
(step, rank). A row holds the union of the fields of its lines; every row has every
column, ``null`` where its lines had no value. A field that more than one component
writes (``stage``, ``timestamp_ns``, ``hostname``, a metric both log) becomes one column
per component, ``<component>/<field>`` (``rollout/timestamp_ns``, ``actor/timestamp_ns``),
so merging loses nothing across components. Within a row and column a later line
(``timestamp_ns`` order) replaces an earlier one -- the re-run steps of a resumed run, or
the ranks of one component when ``rank`` is not a merge field -- and is counted as
overwritten. Lines of a stage whose ``step`` is not a training step -- ``system``, whose
step is a sample index (:mod:`rlpulse.producers.caller.system`) -- get rows of their own (as if
``stage`` were a merge field), never mixed into the training step of the same number; and
lines of different runs (their ``run_id``: runs that shared a ``log_dir`` append to the same
files) get rows of their own too.
Columns come in the order they first appear: the merge fields first; every
row ends with ``global_step`` (its ``step``, the name verl's logs use) and ``aggregated_at``
(when the aggregation ran, ISO 8601 in UTC).
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from rlpulse.schemas.jsonl import MalformedLine, RankRecord, read_rank_logs
from rlpulse.schemas.records import READING_STAGES

__all__ = [
    "READING_STAGES",
    "RUN_FIELD",
    "STDOUT",
    "AggregateSummary",
    "Aggregator",
    "aggregate",
    "aggregate_directory",
    "parse_fields",
]

STDOUT: Final = "-"
"""The output file name that means standard output."""
RUN_FIELD: Final = "run_id"
"""Lines of different runs (EventLogger writes ``run_id``) never share a row."""


class Aggregator:
    """Collects rank records and merges them into rows; :func:`aggregate` in steps."""

    def __init__(self, merge_on: Sequence[str]) -> None:
        if not merge_on or len(set(merge_on)) != len(merge_on):
            raise ValueError(f"merge_on must name distinct fields, got {list(merge_on)!r}")
        self.merge_on: tuple[str, ...] = tuple(merge_on)
        self.overwritten = 0  # values replaced by a later line of the same row and column
        self._keys: dict[str, tuple[Any, ...]] = {}  # row id -> merge values, first seen
        self._cells: dict[str, dict[tuple[str, str], Any]] = {}  # (component, field) -> value
        self._fields: dict[str, set[str]] = {}  # field -> components writing it
        self._order: dict[tuple[str, str], None] = {}  # (component, field), first seen first

    def add(self, record: RankRecord) -> None:
        """Merge one line into the row of its merge key."""
        values = tuple(record.fields.get(name) for name in self.merge_on)
        sampled = record.stage if record.stage in READING_STAGES else None
        run = None if RUN_FIELD in self.merge_on else record.fields.get(RUN_FIELD)
        row = json.dumps([*values, sampled, run], sort_keys=True)  # hashable; NaN equals NaN
        self._keys.setdefault(row, values)
        cells = self._cells.setdefault(row, {})
        for name, value in record.fields.items():
            if name in self.merge_on:
                continue
            cell = (record.component, name)
            if cell in cells and not _same(cells[cell], value):
                self.overwritten += 1
            cells[cell] = value
            self._fields.setdefault(name, set()).add(record.component)
            self._order.setdefault(cell)

    def columns(self) -> list[str]:
        """The column names: the merge fields, then the others in order of appearance."""
        names = dict.fromkeys(self.merge_on)
        names.update((self._column(cell), None) for cell in self._order)
        return list(names)

    def rows(self, sort_by: Sequence[str] = ()) -> list[dict[str, Any]]:
        """One dict per merge key with every column; sorted by ``sort_by`` (stable).

        Values sort numbers first (NaN after them), then strings, then other values, then
        nulls. Raises ``ValueError`` for a ``sort_by`` name that is not a column.
        """
        columns = self.columns()
        unknown = [name for name in sort_by if name not in columns]
        if unknown:
            raise ValueError(f"cannot sort by {unknown}: not a column; columns: {columns}")
        rows: list[dict[str, Any]] = []
        for row, values in self._keys.items():
            merged: dict[str, Any] = dict.fromkeys(columns)
            merged.update(zip(self.merge_on, values, strict=True))
            for cell, value in self._cells[row].items():
                merged[self._column(cell)] = value
            rows.append(merged)
        rows.sort(key=lambda merged: tuple(_sort_key(merged[name]) for name in sort_by))
        return rows

    def _column(self, cell: tuple[str, str]) -> str:
        component, name = cell
        return name if len(self._fields[name]) == 1 else f"{component}/{name}"


def aggregate(
    records: Iterable[RankRecord], merge_on: Sequence[str], sort_by: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Merge per-rank records into one row per merge key; see the module docstring."""
    aggregator = Aggregator(merge_on)
    for record in records:
        aggregator.add(record)
    return aggregator.rows(sort_by)


def parse_fields(text: str) -> list[str]:
    """``"step, rank"`` -> ``["step", "rank"]``; empty names are dropped."""
    return [name.strip() for name in text.split(",") if name.strip()]


@dataclass
class AggregateSummary:
    """What :func:`aggregate_directory` did."""

    rows: int = 0
    columns: int = 0
    overwritten: int = 0
    malformed: list[MalformedLine] = field(default_factory=list)


def aggregate_directory(
    directory: Path,
    merge_on: Sequence[str],
    sort_by: Sequence[str],
    now: datetime.datetime | None = None,
) -> tuple[str, AggregateSummary]:
    """Merge every rank file of ``directory``: the JSON Lines text, and what it held.

    Each line gets ``global_step`` (the row's ``step``) and ``aggregated_at`` (``now``,
    default: the current time, in UTC). Raises ``OSError`` or ``ValueError`` for a
    directory that cannot be read or merged.
    """
    summary = AggregateSummary()
    aggregator = Aggregator(merge_on)
    for item in read_rank_logs(directory):
        if isinstance(item, MalformedLine):
            summary.malformed.append(item)
        else:
            aggregator.add(item)
    rows = aggregator.rows(sort_by)
    stamp = (now or datetime.datetime.now(datetime.UTC)).isoformat(timespec="seconds")
    lines = []
    for row in rows:
        row["global_step"] = row.get("step")
        row["aggregated_at"] = stamp
        lines.append(json.dumps(row) + "\n")
    summary.rows = len(rows)
    summary.columns = len(aggregator.columns()) + 2
    summary.overwritten = aggregator.overwritten
    return "".join(lines), summary


def _same(old: Any, new: Any) -> bool:
    both_nan = isinstance(old, float) and isinstance(new, float) and math.isnan(old)
    return bool(old == new) or (both_nan and math.isnan(new))


def _sort_key(value: Any) -> tuple[int, Any]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (1, 0.0) if math.isnan(value) else (0, value)
    if isinstance(value, str):
        return (2, value)
    if value is None:
        return (4, 0)
    return (3, json.dumps(value, sort_keys=True))
