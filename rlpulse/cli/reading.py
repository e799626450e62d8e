"""What the commands that read the archive share: the ``--archive`` option and opening it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rlpulse.cli.common import setting_option, settings

if TYPE_CHECKING:
    import duckdb

__all__ = ["ArchiveRoot", "Output", "open_for"]

ArchiveRoot = Annotated[
    str | None,
    setting_option("archive.root", "--archive", shown=lambda chosen: chosen.archive_root),
]
Output = Annotated[str, typer.Option("--format", help="table, csv or json (one object per line).")]


def open_for(
    config: Path | None, prefix: str | None, root: str | None
) -> tuple[duckdb.DuckDBPyConnection, str]:
    """A DuckDB connection over the archive the settings name, and its root.

    Raises :class:`~rlpulse.archive.exceptions.ArchiveError` when it is not there.
    """
    from rlpulse.archive.catalog import open_archive, require_archive
    from rlpulse.schemas.topics import Topics

    chosen = settings(config, {"prefix": prefix, "archive.root": root})
    require_archive(chosen.archive_root, chosen.archive)
    con = open_archive(chosen.archive_root, Topics(chosen.prefix), options=chosen.archive)
    return con, chosen.archive_root
