"""``rlpulse audit [--run RUN]``: did every record reach the archive, once? Exit 1 if not."""

from __future__ import annotations

from typing import Annotated

import typer

from rlpulse.cli.common import ConfigFile, Prefix, default_note, fail, one_line_errors, out
from rlpulse.cli.reading import ArchiveRoot, open_for
from rlpulse.cli.render import print_rows


@one_line_errors
def audit(
    run: Annotated[
        str | None, typer.Option(help="Audit this run only. " + default_note("every run"))
    ] = None,
    archive: ArchiveRoot = None,
    prefix: Prefix = None,
    config: ConfigFile = None,
) -> None:
    """Per producer: records received, duplicates, missing seq ranges; per run and host too.

    Per host: its clock against the brokers', as its agent measured it (the estimate with the
    smallest error among the run's records).

    Exits 1 when records are lost, when --run names a run the archive holds no records of,
    and when the archive is not there.
    """
    from rlpulse.archive.audit import audit_runs

    con, root = open_for(config, prefix, archive)
    try:
        audits = audit_runs(con, run)
    finally:
        con.close()
    if not audits:
        out.print(f"the archive at {root} holds no runs")
        return
    report = audits[0].report
    if run is not None and not (
        report["producers"] or report["dead_letters"] or report["steps_with_missing_ranks"]
    ):
        raise fail(f"{report['summary']} (archive: {root})")
    print_rows(
        ["run", "producer", "host", "rank", "received", "duplicates", "lost", "last seq"],
        [
            [p.run_id, p.producer_id, p.hostname, p.rank, p.received, p.duplicates, p.lost,
             p.last_seq]
            for result in audits
            for p in result.producers
        ],
        title="producers",
    )  # fmt: skip
    clocks = [
        [result.report["run_id"], clock.hostname, clock.offset_ms, clock.error_ms, clock.records]
        for result in audits
        for clock in result.clocks
    ]
    if clocks:
        print_rows(
            ["run", "host", "clock behind brokers (ms)", "± (ms)", "records with it"],
            clocks,
            title="host clocks, as their agents measured them",
        )
    for result in audits:
        report = result.report
        style = "green" if report["ok"] else "bold red"
        out.print(f"[{style}]{'ok' if report['ok'] else 'LOST'}[/] {report['summary']}")
    if any(not result.report["ok"] for result in audits):
        raise typer.Exit(1)
