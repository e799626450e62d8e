"""``rlpulse diagnose``: which records match, what they have in common, and a CSV of them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rlpulse.cli.common import ConfigFile, Prefix, err, one_line_errors, out, settings
from rlpulse.cli.reading import ArchiveRoot

if TYPE_CHECKING:
    from rlpulse.offline.diagnose import LogFilter, LogSummary


@one_line_errors
def diagnose(
    start_time: Annotated[
        str | None,
        typer.Option(
            "--start-time",
            "--start_time",
            help="From this time on: 2025-10-01 08:00:00 (in --tz), or with an offset / Z.",
        ),
    ] = None,
    end_time: Annotated[
        str | None,
        typer.Option("--end-time", "--end_time", help="Up to this time (inclusive)."),
    ] = None,
    tz: Annotated[
        str, typer.Option(help="Zone of times given without an offset: UTC, local or IANA.")
    ] = "UTC",
    level: Annotated[
        str | None, typer.Option(help="This level and above: DEBUG, INFO, WARN, ERROR, CRITICAL.")
    ] = None,
    host: Annotated[
        list[str] | None, typer.Option(help="Host name or IP (repeat for several).")
    ] = None,
    pid: Annotated[list[int] | None, typer.Option(help="Process id (repeat for several).")] = None,
    rank: Annotated[list[int] | None, typer.Option(help="Rank (repeat for several).")] = None,
    run: Annotated[str | None, typer.Option(help="Run id.")] = None,
    trace_id: Annotated[
        str | None, typer.Option("--trace-id", "--trace_id", help="Trace id.")
    ] = None,
    grep: Annotated[
        str | None, typer.Option(help="Regular expression searched in messages and tracebacks.")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", help="Write the matching records to this CSV.")
    ] = None,
    log_dir: Annotated[
        Path | None,
        typer.Option(
            "--log-dir",
            "--log_dir",
            help="Read the per-rank files under this directory instead of the archive.",
        ),
    ] = None,
    archive: ArchiveRoot = None,
    top: Annotated[int, typer.Option(help="How many frequent messages to show.")] = 10,
    prefix: Prefix = None,
    config: ConfigFile = None,
) -> None:
    """Summarize the log records that match (counts by level and host, frequent messages)."""
    from rlpulse.archive.catalog import open_archive, require_archive
    from rlpulse.archive.tables import tables_of
    from rlpulse.offline.diagnose import (
        LogFilter,
        directory_connection,
        level_number,
        parse_instant,
        select_records,
        summarize,
        time_zone,
        write_csv,
    )
    from rlpulse.schemas.codec import default_codec
    from rlpulse.schemas.topics import Topics

    zone = time_zone(tz)
    chosen = LogFilter(
        start_ns=None if start_time is None else parse_instant(start_time, zone),
        end_ns=None if end_time is None else parse_instant(end_time, zone),
        min_level=None if level is None else level_number(level),
        hosts=tuple(host or ()),
        pids=tuple(pid or ()),
        ranks=tuple(rank or ()),
        run_id=run,
        trace_id=trace_id,
        grep=grep,
    )
    loaded = settings(config, {"prefix": prefix, "archive.root": archive})
    topics = Topics(loaded.prefix)
    if log_dir is not None:
        logs = tables_of(topics, default_codec())["logs"]
        con, malformed = directory_connection(log_dir, logs)
        source = str(log_dir)
        for problem in malformed:
            err.print(f"{problem}; skipped", highlight=False, soft_wrap=True)
    else:
        require_archive(loaded.archive_root, loaded.archive)
        con = open_archive(loaded.archive_root, topics, options=loaded.archive)
        source = loaded.archive_root
    try:
        records = select_records(con, chosen, partitioned=log_dir is None)
    finally:
        con.close()
    _print_summary(summarize(records, top), chosen, source)
    if output is not None:
        count = write_csv(output, records)
        out.print(f"{count} records -> {output}")


def _print_summary(summary: LogSummary, chosen: LogFilter, source: str) -> None:
    from rich.table import Table

    from rlpulse.offline.diagnose import utc_text

    window = (
        f"from {utc_text(chosen.start_ns) or 'the start'} to {utc_text(chosen.end_ns) or 'now'}"
    )
    out.print(f"{summary.records} records in {source}, {window}", highlight=False)
    if not summary.records:
        return
    out.print(
        f"first {utc_text(summary.first_ns)}, last {utc_text(summary.last_ns)}", highlight=False
    )
    out.print(
        "by level: "
        + ", ".join(f"{name} {count}" for name, count in summary.by_level.most_common()),
        highlight=False,
    )
    out.print(
        "by host: " + ", ".join(f"{name} {count}" for name, count in summary.by_host.most_common()),
        highlight=False,
    )
    table = Table(title="most frequent messages (numbers and ids folded)", title_justify="left")
    for column in ("count", "first (UTC)", "last (UTC)", "message"):
        table.add_column(column, overflow="fold")
    for pattern in summary.patterns:
        table.add_row(
            str(pattern.count),
            utc_text(pattern.first_ns).removesuffix(" UTC"),
            utc_text(pattern.last_ns).removesuffix(" UTC"),
            pattern.text,
        )
    out.print(table)
