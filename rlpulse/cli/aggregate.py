"""``rlpulse aggregate``: merge a run's per-rank JSON Lines into one view."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from rlpulse.cli.common import default_note, err, fail, one_line_errors
from rlpulse.offline.aggregate import STDOUT, aggregate_directory, parse_fields


@one_line_errors
def aggregate(
    input_dir: Annotated[
        Path,
        typer.Option(
            "--input-dir",
            help="Directory of <component>_rank<N>.jsonl (or rank<N>.jsonl) files.",
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
        typer.Option(
            "--sort-by",
            help="Comma-separated fields to sort by. " + default_note("--merge-on"),
        ),
    ] = None,
) -> None:
    """Merge per-rank JSON Lines into one line per merge key, missing values as null.

    Fields that several components write become <component>/<field> columns; every line
    also gets global_step (its step) and aggregated_at (when this ran, UTC). System samples
    (stage system: their step is a sample index) keep rows of their own. Unreadable lines
    are reported on stderr with file:line and skipped.
    """
    merge_fields = parse_fields(merge_on)
    sort_fields = parse_fields(sort_by) if sort_by is not None else merge_fields
    try:
        text, summary = aggregate_directory(input_dir, merge_fields, sort_fields)
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    if str(output_file) == STDOUT:
        sys.stdout.write(text)
    else:
        output_file.parent.mkdir(parents=True, exist_ok=True)
        output_file.write_text(text, encoding="utf-8")
    for problem in summary.malformed:
        err.print(f"{problem}; skipped", highlight=False, soft_wrap=True)
    where = "stdout" if str(output_file) == STDOUT else str(output_file)
    err.print(
        f"{summary.rows} rows, {summary.columns} columns -> {where}; "
        f"{len(summary.malformed)} malformed lines skipped, "
        f"{summary.overwritten} values overwritten by a later line of the same key",
        highlight=False,
        soft_wrap=True,
    )
