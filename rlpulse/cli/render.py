"""Rows as a terminal table, CSV or JSON lines: the output of ``rlpulse query`` and friends."""

from __future__ import annotations

import csv
import datetime
import json
import math
import sys
from collections.abc import Sequence
from typing import Any, Literal, TextIO

from rich.table import Table

from rlpulse.cli.common import out

__all__ = ["OutputFormat", "cell", "jsonable", "print_rows"]

OutputFormat = Literal["table", "csv", "json"]
_SHOWN_BYTES = 16


def jsonable(value: Any) -> Any:
    """``value`` with times as ISO 8601 text, bytes as hex and non-finite floats as text."""
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return value.hex()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def cell(value: Any) -> str:
    """One value as text for a table or CSV cell (nested values as JSON)."""
    if value is None:
        return ""
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, bytes | bytearray):
        shown = value[:_SHOWN_BYTES].hex()
        return shown + ("..." if len(value) > _SHOWN_BYTES else "")
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict | list | tuple):
        return json.dumps(jsonable(value), separators=(",", ":"))
    return str(value)


def print_rows(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    output: OutputFormat = "table",
    title: str | None = None,
    stream: TextIO | None = None,
) -> None:
    """Print ``rows`` under ``columns`` as a rich table, CSV or one JSON object per line."""
    target = stream or sys.stdout
    if output == "csv":
        writer = csv.writer(target)
        writer.writerow(columns)
        writer.writerows([cell(v) for v in row] for row in rows)
        return
    if output == "json":
        for row in rows:
            record = {c: jsonable(v) for c, v in zip(columns, row, strict=True)}
            target.write(json.dumps(record) + "\n")
        return
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(cell(v) for v in row))
    out.print(table)
