"""``rlpulse replay [DIR]``: send what dead trainer processes left in their write-ahead logs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlpulse.cli.common import Bootstrap, ConfigFile, err, in_force, one_line_errors, out, settings
from rlpulse.producers.delivery.replay import ReplayReport, replay_logs
from rlpulse.producers.delivery.spool_root import resolve_spool_root
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import bootstrap_servers


@one_line_errors
def replay(
    directory: Annotated[
        Path | None,
        typer.Argument(
            help="A directory of write-ahead logs, searched recursively. "
            + in_force("producer.spool_dir", shown=lambda chosen: chosen.spool_root)
        ),
    ] = None,
    bootstrap: Bootstrap = None,
    prefix: Annotated[
        str | None,
        typer.Option(help="Send to <prefix>.events and <prefix>.logs, not the logs' own topics."),
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for Kafka and for the records' delivery.")
    ] = 60.0,
    config: ConfigFile = None,
) -> None:
    """Send what trainer processes left in their write-ahead logs (e.g. after a kill).

    What is already on the topics (sent before the process died) is read back and not sent
    again, so every record arrives once however often this runs. A log sent whole is
    deleted; each log that is not is named with its cause and kept. Exits 0 when every
    record was sent (or there was none), 1 when some were not.
    """
    chosen = settings(config, {"bootstrap": bootstrap})
    root = directory or resolve_spool_root(chosen).path
    if not root.exists():
        err.print(f"{root} does not exist: nothing to replay", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    report = replay_logs(root, chosen, prefix=prefix, timeout_s=timeout)
    print_report(report, root, chosen, again="run the replay again")


def print_report(report: ReplayReport, root: Path, chosen: Settings, again: str) -> None:
    """Say what a replay of the logs under ``root`` did; exit 1 if it left records unsent.

    ``again``: what to do about the logs kept (``rlpulse spool send`` says it too).
    """
    out.print(
        f"sent {report.delivered} record(s) from {report.logs} write-ahead log(s) under "
        f"{root} to {bootstrap_servers(chosen)}; {report.found} were there already",
        highlight=False,
        soft_wrap=True,
    )
    if report.busy_producers:
        out.print(f"skipped {report.busy_producers} log(s) held by a live process")
    if report.other_hosts:
        out.print(f"skipped {report.other_hosts} log(s) another host wrote")
    for kept in report.kept:
        err.print(
            f"{kept.path}: {kept.records} record(s) not sent: {kept.cause}",
            highlight=False,
            soft_wrap=True,
        )
    if not report.complete:
        err.print(
            f"{report.undelivered} record(s) in {len(report.kept)} log(s) not sent; "
            f"the logs are kept: {again}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)
