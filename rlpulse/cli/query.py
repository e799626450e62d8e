"""``rlpulse query "SQL"``: DuckDB over the archive."""

from __future__ import annotations

from typing import Annotated, cast

import typer

from rlpulse.cli.common import ConfigFile, Prefix, fail, one_line_errors, settings
from rlpulse.cli.reading import ArchiveRoot, Output
from rlpulse.cli.render import OutputFormat, print_rows

FORMATS = ("table", "csv", "json")


@one_line_errors
def query(
    sql: Annotated[
        str,
        typer.Argument(
            help="SQL over the views events, logs, steps, commands, acks, audits, dead_letters."
        ),
    ],
    archive: ArchiveRoot = None,
    prefix: Prefix = None,
    output: Output = "table",
    config: ConfigFile = None,
) -> None:
    """Run SQL over the archive (DuckDB; times are UTC). See docs/logs.md for the columns."""
    if output not in FORMATS:
        raise fail(f"--format {output!r}: use one of {', '.join(FORMATS)}")
    from rlpulse.archive.catalog import query_archive, require_archive
    from rlpulse.schemas.topics import Topics

    chosen = settings(config, {"prefix": prefix, "archive.root": archive})
    require_archive(chosen.archive_root, chosen.archive)
    columns, rows = query_archive(
        chosen.archive_root, Topics(chosen.prefix), sql, options=chosen.archive
    )
    print_rows(columns, rows, cast(OutputFormat, output))
