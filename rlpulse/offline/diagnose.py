"""``rlpulse diagnose``: the log records that match a filter, and what they have in common.

The records come from the archive's ``logs`` view or from a directory of per-rank files
(``<component>_rank<N>.jsonl`` and their rotated ``.jsonl.<time>`` files, the log lines
only); the same SQL selects from both. Times are exact instants: a time with an offset
(``2025-10-01T08:00:00+02:00``, ``...Z``) means what it says, a time without one is read in
the zone given (UTC unless told otherwise), and everything printed is UTC.

A record's time is its host's ``timestamp_ns`` corrected by the clock offset its host agent
sent with it (:data:`~rlpulse.archive.catalog.CORRECTED_NS`: the brokers' clock, so that
records of several hosts come in the order they happened): the window selects by it, records
come in its order, and ``time`` shows it; ``timestamp_ns`` and ``clock_offset_ns`` stay in
the CSV. The per-rank files carry no offset: there it is the host's own time.

The summary: counts by level and by host, the first and last record, and the most frequent
messages with numbers, hex ids and UUIDs folded together (``step <n> took <n> s``), each
with its count and first and last time.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import duckdb
import pyarrow as pa

from rlpulse.archive.catalog import CORRECTED_NS, corrected_window, register_logs, run_sql
from rlpulse.archive.exceptions import QueryError
from rlpulse.archive.tables import Table, run_partition
from rlpulse.schemas.jsonl import LOG_KIND, MalformedLine, read_json_lines

__all__ = [
    "CSV_COLUMNS",
    "LogFilter",
    "LogSummary",
    "fold_message",
    "level_number",
    "log_dir_records",
    "parse_instant",
    "select_records",
    "summarize",
    "time_zone",
    "write_csv",
]

CSV_COLUMNS: Final = (
    "time",
    "level",
    "hostname",
    "host_ip",
    "pid",
    "rank",
    "run_id",
    "attempt",
    "step",
    "stage",
    "logger",
    "trace_id",
    "message",
    "exception",
    "producer_id",
    "seq",
    "timestamp_ns",
    "clock_offset_ns",
)
"""The columns of ``diagnose --output``: ``time`` is UTC, ISO 8601, on the brokers' clock
(``timestamp_ns``, the host's, plus ``clock_offset_ns``, empty where none came)."""

LEVELS: Final = {"DEBUG": 10, "INFO": 20, "WARN": 30, "WARNING": 30, "ERROR": 40}
LEVELS_ALSO: Final = {"CRITICAL": 50, "FATAL": 50}
_NS: Final = 1_000_000_000
_UUID: Final = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
_HEX: Final = re.compile(
    r"\b(?:0x[0-9a-fA-F]+|(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,})\b"
)
_NUMBER: Final = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_ROTATED_OR_LIVE: Final = re.compile(r".+_rank\d+\.jsonl(?:\.\d{8}T\d{6}\.\d{6}Z(?:-\d+)?)?$")


def level_number(name: str) -> int:
    """The number of a level name (``WARN`` is ``WARNING``) or of a number given as text."""
    text = name.strip().upper()
    if text.isdigit():
        return int(text)
    found = LEVELS.get(text, LEVELS_ALSO.get(text))
    if found is None:
        raise QueryError(
            f"unknown level {name!r}; use DEBUG, INFO, WARN (WARNING), ERROR or CRITICAL"
        )
    return found


def time_zone(name: str) -> datetime.tzinfo:
    """``UTC``, ``local`` (this machine's zone) or an IANA name such as ``Europe/Berlin``."""
    if name.upper() == "UTC":
        return datetime.UTC
    if name.lower() == "local":
        local = datetime.datetime.now().astimezone().tzinfo
        assert local is not None
        return local
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise QueryError(f"unknown time zone {name!r}; use UTC, local or an IANA name") from None


def parse_instant(text: str, zone: datetime.tzinfo) -> int:
    """Nanoseconds since the epoch of an ISO 8601 time; ``zone`` is for times without one."""
    value = text.strip()
    try:
        moment = datetime.datetime.fromisoformat(value.replace(" ", "T", 1))
    except ValueError:
        raise QueryError(
            f"{text!r} is not a time; write it like 2025-10-01 08:00:00, "
            "2025-10-01T08:00:00+02:00 or 2025-10-01T06:00:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)
    seconds = int(moment.timestamp())
    return seconds * _NS + moment.microsecond * 1000


def utc_text(ns: int | None) -> str:
    """A time in ns as ``2025-10-01 08:00:00.123456 UTC`` (empty for None)."""
    if ns is None:
        return ""
    moment = datetime.datetime.fromtimestamp(ns // _NS, datetime.UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S}.{ns % _NS // 1000:06d} UTC"


def iso_utc(ns: int | None) -> str:
    """A time in ns as ISO 8601 UTC with microseconds (``2025-10-01T08:00:00.123456Z``)."""
    if ns is None:
        return ""
    moment = datetime.datetime.fromtimestamp(ns // _NS, datetime.UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ns % _NS // 1000:06d}Z"


@dataclass(frozen=True)
class LogFilter:
    """Which records to select; every field left empty selects everything."""

    start_ns: int | None = None
    """From this time on (the brokers' clock: a record's corrected time)."""
    end_ns: int | None = None
    """Up to this time (inclusive)."""
    min_level: int | None = None
    hosts: tuple[str, ...] = ()
    """Host names or IP addresses."""
    pids: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()
    run_id: str | None = None
    trace_id: str | None = None
    grep: str | None = None
    """A regular expression searched in the message and the exception text."""

    def where(self, partitioned: bool) -> tuple[str, list[Any]]:
        """The SQL condition and its parameters; ``partitioned``: prune by date and run too."""
        terms, parameters = corrected_window(self.start_ns, self.end_ns, partitioned)
        if self.min_level is not None:
            terms.append("levelno >= ?")
            parameters.append(self.min_level)
        if self.hosts:
            marks = ", ".join("?" * len(self.hosts))
            terms.append(f"(hostname IN ({marks}) OR host_ip IN ({marks}))")
            parameters += [*self.hosts, *self.hosts]
        for column, values in (("pid", self.pids), ("rank", self.ranks)):
            if values:
                terms.append(f"{column} IN ({', '.join('?' * len(values))})")
                parameters += list(values)
        if self.run_id is not None:
            terms.append("run_id = ?")
            parameters.append(self.run_id)
            if partitioned:
                terms.append("run = ?")
                parameters.append(run_partition(self.run_id))
        if self.trace_id is not None:
            terms.append("trace_id = ?")
            parameters.append(self.trace_id)
        if self.grep is not None:
            try:
                re.compile(self.grep)
            except re.error as exc:
                raise QueryError(
                    f"--grep {self.grep!r} is not a regular expression: {exc}"
                ) from None
            terms.append(
                "(regexp_matches(message, ?) OR regexp_matches(coalesce(exception, ''), ?))"
            )
            parameters += [self.grep, self.grep]
        return (" AND ".join(terms) or "TRUE"), parameters


def select_records(
    con: duckdb.DuckDBPyConnection, chosen: LogFilter, partitioned: bool
) -> list[dict[str, Any]]:
    """The records of ``con``'s ``logs`` view that ``chosen`` selects, oldest first.

    Each has the :data:`CSV_COLUMNS` and ``corrected_ns``, its time on the brokers' clock.
    """
    where, parameters = chosen.where(partitioned)
    columns = ", ".join(column for column in CSV_COLUMNS if column != "time")
    names, rows = run_sql(
        con,
        f"SELECT {columns}, {CORRECTED_NS} AS corrected_ns FROM logs WHERE {where} "
        "ORDER BY corrected_ns, producer_id, seq",
        parameters,
    )
    records = []
    for row in rows:
        record = dict(zip(names, row, strict=True))
        record["time"] = iso_utc(record["corrected_ns"])
        records.append(record)
    return records


def fold_message(message: str) -> str:
    """``message`` with UUIDs and hex ids as ``<id>`` and numbers as ``<n>``."""
    folded = _UUID.sub("<id>", message)
    folded = _HEX.sub("<id>", folded)
    return _NUMBER.sub("<n>", folded)


@dataclass
class Pattern:
    """One folded message: how often, and when first and last."""

    text: str
    count: int
    first_ns: int
    last_ns: int


@dataclass
class LogSummary:
    """What the selected records have in common."""

    records: int = 0
    by_level: Counter[str] = field(default_factory=Counter)
    by_host: Counter[str] = field(default_factory=Counter)
    first_ns: int | None = None
    last_ns: int | None = None
    patterns: list[Pattern] = field(default_factory=list)


def summarize(records: Sequence[dict[str, Any]], top: int = 10) -> LogSummary:
    """Counts by level and host, first and last, and the ``top`` most frequent messages.

    Times are the records' ``corrected_ns`` (see :func:`select_records`).
    """
    summary = LogSummary(records=len(records))
    patterns: dict[str, Pattern] = {}
    for record in records:
        stamp = record["corrected_ns"]
        summary.by_level[record["level"]] += 1
        ip = record.get("host_ip")
        summary.by_host[f"{record['hostname']} ({ip})" if ip else record["hostname"]] += 1
        if summary.first_ns is None or stamp < summary.first_ns:
            summary.first_ns = stamp
        if summary.last_ns is None or stamp > summary.last_ns:
            summary.last_ns = stamp
        text = fold_message(record["message"])
        known = patterns.get(text)
        if known is None:
            patterns[text] = Pattern(text, 1, stamp, stamp)
        else:
            known.count += 1
            known.first_ns = min(known.first_ns, stamp)
            known.last_ns = max(known.last_ns, stamp)
    ranked = sorted(patterns.values(), key=lambda p: (-p.count, p.first_ns))
    summary.patterns = ranked[:top]
    return summary


def write_csv(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> int:
    """Write ``records`` with :data:`CSV_COLUMNS` to ``path``; returns how many."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with target.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for record in records:
            writer.writerow({k: "" if v is None else v for k, v in record.items()})
            count += 1
    return count


def _log_files(directory: Path) -> Iterator[Path]:
    if not directory.is_dir():
        raise QueryError(f"{directory} is not a directory")
    for path in sorted(directory.iterdir()):
        if path.is_file() and _ROTATED_OR_LIVE.fullmatch(path.name):
            yield path


def log_dir_records(directory: Path, logs: Table) -> tuple[pa.Table, list[MalformedLine]]:
    """The log record lines of every per-rank file under ``directory``, as ``logs`` rows."""
    names = [field.name for field in logs.schema]
    rows: list[dict[str, Any]] = []
    malformed: list[MalformedLine] = []
    for path in _log_files(directory):
        for item in read_json_lines(path):
            if isinstance(item, MalformedLine):
                malformed.append(item)
                continue
            number, line = item
            if line.get("kind") != LOG_KIND:
                continue
            problem = _log_line_problem(line)
            if problem is not None:
                text = json.dumps(line)[:120]
                malformed.append(MalformedLine(path, number, problem, text))
                continue
            rows.append({name: line.get(name) for name in names})
    try:
        table = pa.Table.from_pylist(rows, schema=logs.schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise QueryError(f"log lines under {directory} do not fit the logs table: {exc}") from None
    return table, malformed


def _log_line_problem(line: dict[str, Any]) -> str | None:
    for name, kind in (("timestamp_ns", int), ("levelno", int), ("message", str), ("level", str)):
        value = line.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"a log line needs {name} ({kind.__name__}), got {value!r}"
    return None


def directory_connection(
    directory: Path, logs: Table
) -> tuple[duckdb.DuckDBPyConnection, list[MalformedLine]]:
    """A DuckDB connection whose ``logs`` view holds the log lines under ``directory``."""
    table, malformed = log_dir_records(directory, logs)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    register_logs(con, table)
    return con, malformed
