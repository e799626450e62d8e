"""``rlpulse replay [DIR]``: send the events a dead trainer process left in its spool."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlpulse.cli.common import Bootstrap, ConfigFile, err, in_force, one_line_errors, out, settings
from rlpulse.producers.replay import replay_spool
from rlpulse.schemas.topics import Topics
from rlpulse.transport.bootstrap import bootstrap_servers


@one_line_errors
def replay(
    directory: Annotated[
        Path | None,
        typer.Argument(
            help="A spool directory, searched recursively. "
            + in_force("producer.spool_dir", shown=lambda chosen: chosen.spool_root)
        ),
    ] = None,
    bootstrap: Bootstrap = None,
    prefix: Annotated[
        str | None, typer.Option(help="Send to <prefix>.events instead of the spooled topic.")
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for Kafka, and for each spool file's delivery.")
    ] = 60.0,
    config: ConfigFile = None,
) -> None:
    """Send the events a trainer process left in its spool (e.g. after it was killed).

    Every spool file is tried (a producer's later files wait behind one of its files that
    failed, to keep its events in order); each file not delivered is named with its cause.
    Exits 0 when every event was delivered (or there was none), 1 when some were not
    (their files are kept for another try).
    """
    chosen = settings(config, {"bootstrap": bootstrap, "prefix": prefix})
    root = directory or chosen.spool_root
    topic = None if prefix is None else Topics(chosen.prefix).events
    report = replay_spool(root, chosen, topic=topic, timeout_s=timeout)
    out.print(
        f"replayed {report.delivered} event(s) from {report.files} spool file(s) under "
        f"{root} to {bootstrap_servers(chosen)}",
        highlight=False,
        soft_wrap=True,
    )
    if report.busy_producers:
        out.print(f"skipped {report.busy_producers} spool(s) held by a live process")
    if report.unreadable_lines:
        out.print(f"skipped {report.unreadable_lines} unreadable line(s)")
    for kept in report.kept:
        err.print(
            f"{kept.path}: {kept.events} event(s) not delivered: {kept.cause}",
            highlight=False,
            soft_wrap=True,
        )
    if not report.complete:
        err.print(
            f"{report.undelivered} event(s) in {len(report.kept)} spool file(s) not delivered; "
            "their files are kept: run the replay again",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)
