"""``rlpulse archive``: run an archiver (every topic to Parquet); ``rlpulse archive prune``."""

from __future__ import annotations

import signal
import time
from typing import Annotated

import typer

from rlpulse.cli.common import (
    Bootstrap,
    ConfigFile,
    Prefix,
    StartupTimeoutAlias,
    command_settings,
    one_line_errors,
    out,
    say,
    setting_option,
    settings,
)
from rlpulse.transport.bootstrap import bootstrap_servers

archive_app = typer.Typer(
    help="Archive every rlpulse topic to Parquet (a consumer group: run more for more).",
    invoke_without_command=True,
)

Root = Annotated[
    str | None,
    setting_option("archive.root", shown=lambda s: s.archive_root),
]
RetentionDays = Annotated[
    float | None,
    setting_option("archive.retention_days"),
]


@archive_app.callback(invoke_without_command=True)
@one_line_errors
def archive(
    ctx: typer.Context,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    root: Root = None,
    group: Annotated[
        str | None,
        setting_option("archive.group_id", shown=lambda s: s.archive_group),
    ] = None,
    roll_bytes: Annotated[
        str | None,
        setting_option(
            "archive.roll_bytes",
            shown=lambda s: s.archive.roll_bytes.human_readable(decimal=True),
            note="(64MB, 1GB, or bytes)",
        ),
    ] = None,
    roll_s: Annotated[
        str | None,
        setting_option("archive.roll_s", note="(300s, 10m)"),
    ] = None,
    retention_days: RetentionDays = None,
    startup_timeout_s: Annotated[
        float | None,
        setting_option("archive.startup_timeout_s", "--startup-timeout-s"),
    ] = None,
    config: ConfigFile = None,
    startup_timeout: StartupTimeoutAlias = None,
) -> None:
    """Archive events, logs, steps, commands, acks, audits and dead letters until SIGTERM."""
    if ctx.invoked_subcommand is not None:
        return
    from rlpulse.streams.archiver.archiver import Archiver

    chosen = command_settings(archive, locals())
    archiver = Archiver(chosen, say)
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda _signal, _frame: archiver.stop())
    say(
        f"archiver {chosen.archive_group}: {chosen.prefix}.* from Kafka "
        f"{bootstrap_servers(chosen)} to {chosen.archive_root}"
    )
    counts = archiver.run()
    say(
        f"archiver stopped: {counts.records} records in {counts.files} files "
        f"({counts.flushes} flushes), {counts.undecodable} undecodable, "
        f"{counts.recovered} unfinished flushes redone, {counts.pruned} files pruned, "
        f"{counts.audits} audits ({counts.silent_audits} of runs silent without a run_end)"
    )


@archive_app.command("prune")
@one_line_errors
def archive_prune(
    prefix: Prefix = None,
    root: Root = None,
    retention_days: RetentionDays = None,
    config: ConfigFile = None,
) -> None:
    """Delete archived records older than the retention (a partition's newest files stay)."""
    from rlpulse.archive.store import ArchiveStore
    from rlpulse.archive.tables import tables_of
    from rlpulse.schemas.codec import default_codec
    from rlpulse.schemas.topics import Topics
    from rlpulse.streams.archiver.prune import cutoff_ms, prune

    chosen = settings(
        config,
        {"prefix": prefix, "archive.root": root, "archive.retention_days": retention_days},
    )
    tables = tables_of(Topics(chosen.prefix), default_codec())
    cutoff = cutoff_ms(round(time.time() * 1000), chosen.archive.retention_days)
    store = ArchiveStore(chosen.archive_root, chosen.archive)
    result = prune(store, [table.topic for table in tables.values()], cutoff)
    for path in result.deleted:
        say(f"deleted {path}")
    out.print(
        f"deleted {len(result.deleted)} file(s) older than {chosen.archive.retention_days:g} "
        f"days from {chosen.archive_root}; kept {len(result.kept_newest)} older file(s) "
        "that mark where archiving resumes"
    )
