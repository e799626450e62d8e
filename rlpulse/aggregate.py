"""``rlpulse aggregate``: merge the per-rank JSON Lines of a run into one table-like view.

Every line of ``<component>_rank<N>.jsonl`` (read with :mod:`rlpulse.producers.jsonl`,
``rank`` filled in from the file name) goes to the row of its merge key, by default
(step, rank). A row holds the union of the fields of its lines; every row has every
column, ``null`` where its lines had no value. A field that more than one component
writes (``stage``, ``timestamp_ns``, ``hostname``, a metric both log) becomes one column
per component, ``<component>/<field>`` (``rollout/timestamp_ns``, ``actor/timestamp_ns``),
so merging loses nothing across components. Within a row and column a later line
(``timestamp_ns`` order) replaces an earlier one -- the re-run steps of a resumed run, or
the ranks of one component when ``rank`` is not a merge field -- and is counted as
overwritten. Columns come in the order they first appear: the merge fields first.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Final

import typer

from rlpulse.producers.jsonl import MalformedLine, RankRecord, read_rank_logs

__all__ = ["Aggregator", "aggregate", "aggregate_command", "parse_fields"]

_STDOUT: Final = "-"


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
        row = json.dumps(values, sort_keys=True)  # hashable, and NaN equals NaN
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


def aggregate_command(
    input_dir: Annotated[
        Path,
        typer.Option(
            "--input-dir",
            help="Directory of <component>_rank<N>.jsonl files.",
            exists=True,
            file_okay=False,
        ),
    ],
    output_file: Annotated[
        Path, typer.Option("--output-file", help="Where to write the merged lines (- : stdout).")
    ],
    merge_on: Annotated[
        str, typer.Option("--merge-on", help="Comma-separated fields: one line per value.")
    ] = "step,rank",
    sort_by: Annotated[
        str | None,
        typer.Option("--sort-by", help="Comma-separated fields to sort by (default: --merge-on)."),
    ] = None,
) -> None:
    """Merge per-rank JSON Lines into one line per merge key, missing values as null.

    Fields that several components write become <component>/<field> columns. Unreadable
    lines are reported on stderr with file:line and skipped.
    """
    merge_fields = parse_fields(merge_on)
    sort_fields = parse_fields(sort_by) if sort_by is not None else merge_fields
    malformed: list[MalformedLine] = []
    try:
        aggregator = Aggregator(merge_fields)
        for item in read_rank_logs(input_dir):
            if isinstance(item, MalformedLine):
                malformed.append(item)
            else:
                aggregator.add(item)
        rows = aggregator.rows(sort_fields)
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None

    text = "".join(json.dumps(row) + "\n" for row in rows)
    if str(output_file) == _STDOUT:
        sys.stdout.write(text)
    else:
        output_file.parent.mkdir(parents=True, exist_ok=True)
        output_file.write_text(text, encoding="utf-8")
    for problem in malformed:
        typer.echo(f"{problem}; skipped", err=True)
    where = "stdout" if str(output_file) == _STDOUT else str(output_file)
    typer.echo(
        f"{len(rows)} rows, {len(aggregator.columns())} columns -> {where}; "
        f"{len(malformed)} malformed lines skipped, "
        f"{aggregator.overwritten} values overwritten by a later line of the same key",
        err=True,
    )


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


def main() -> None:
    """``python -m rlpulse.aggregate --input-dir logs/ --output-file merged.jsonl``."""
    typer.run(aggregate_command)


if __name__ == "__main__":
    main()
