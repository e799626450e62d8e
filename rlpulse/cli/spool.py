"""``rlpulse spool list|send``: what waits on this host in the write-ahead logs, and sending it.

``list`` shows each producer's log under the spool root that this host wrote, per run:
whether its process is alive and holds it, and what Kafka has not acknowledged
(:func:`~rlpulse.producers.delivery.spool.list_spool`). ``send`` sends the dead ones, as ``rlpulse
replay`` does (:func:`~rlpulse.producers.delivery.spool.send_spool`); a log a live process holds is
never sent from here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ByteSize
from rich.table import Table

from rlpulse.cli.common import (
    Bootstrap,
    ConfigFile,
    default_note,
    fail,
    one_line_errors,
    out,
    setting_option,
    settings,
)
from rlpulse.cli.replay import print_report
from rlpulse.producers.delivery.spool import (
    DEAD,
    SpoolListing,
    SpoolLog,
    host_name,
    list_spool,
    send_spool,
)
from rlpulse.producers.delivery.spool_root import resolve_spool_root
from rlpulse.settings import Settings

spool_app = typer.Typer(
    help="What trainer processes left on this host in their write-ahead logs: list it, send it.",
    no_args_is_help=True,
)

Run = Annotated[str | None, typer.Option("--run", help="Only this run's logs.")]
Host = Annotated[
    str | None,
    typer.Option(
        "--host",
        help="The host whose logs these are (a host's logs are sent from that host only). "
        + default_note("producer.hostname, else this machine's name"),
    ),
]
SpoolDir = Annotated[
    Path | None,
    setting_option(
        "producer.spool_dir",
        "Root of the write-ahead logs.",
        "--spool-dir",
        shown=lambda chosen: resolve_spool_root(chosen).path,
    ),
]


def _chosen(config: Path | None, spool_dir: Path | None, bootstrap: str | None = None) -> Settings:
    return settings(config, {"producer.spool_dir": spool_dir, "bootstrap": bootstrap})


def _root(chosen: Settings, spool_dir: Path | None) -> Path:
    """The spool root; a ``--spool-dir`` that does not exist is a mistake, not an empty spool."""
    root = resolve_spool_root(chosen).path
    if spool_dir is not None and not root.is_dir():
        raise fail(f"no spool at {root}: no such directory (see --spool-dir, producer.spool_dir)")
    return root


def _nothing(listing: SpoolListing, run: str | None) -> str:
    of_run = f" of run {run!r}" if run is not None else ""
    return f"nothing{of_run} waits under {listing.root} for host {listing.host}"


@spool_app.command("list")
@one_line_errors
def spool_list(
    run: Run = None,
    host: Host = None,
    spool_dir: SpoolDir = None,
    json_output: Annotated[bool, typer.Option("--json", help="One JSON object per log.")] = False,
    config: ConfigFile = None,
) -> None:
    """List the logs this host's trainer processes left, per run and producer.

    Each log's process (pid, alive or gone), whether a process holds the log (live: its own
    process sends it; adopted: another process of the run, or a replay, is sending it; dead:
    nobody, `rlpulse spool send` sends it), the events and text records Kafka has not
    acknowledged, the disk the log takes, and its age.
    """
    chosen = _chosen(config, spool_dir)
    listing = list_spool(_root(chosen, spool_dir), host or host_name(chosen), run_id=run)
    now_ns = time.time_ns()
    if json_output:
        for spooled in listing.logs:
            typer.echo(json.dumps(_document(spooled, now_ns)))
        return
    if not listing.logs:
        out.print(_nothing(listing, run), highlight=False, soft_wrap=True)
    else:
        out.print(_table(listing, now_ns))
        _summary(listing)
    if listing.other_hosts:
        out.print(
            f"{listing.other_hosts} log(s) under {listing.root} that other hosts wrote are not "
            "shown: they are sent from their own host",
            highlight=False,
            soft_wrap=True,
        )


@spool_app.command("send")
@one_line_errors
def spool_send(
    run: Run = None,
    host: Host = None,
    spool_dir: SpoolDir = None,
    bootstrap: Bootstrap = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for Kafka and for the records' delivery.")
    ] = 60.0,
    config: ConfigFile = None,
) -> None:
    """Send what the dead logs of `rlpulse spool list` hold, as `rlpulse replay` does.

    Logs a live process holds are left to it. What is already on the topics is read back and
    not sent again, so every record arrives once however often this runs. A log sent whole is
    deleted; each log that is not is named with its cause and kept. Exits 0 when every record
    was sent (or nothing waited), 1 when some were not or ``--run`` names a run with no log
    here.
    """
    chosen = _chosen(config, spool_dir, bootstrap)
    root = _root(chosen, spool_dir)
    host = host or host_name(chosen)
    listing = list_spool(root, host, run_id=run)
    if not listing.dead:
        if run is not None and not listing.logs:
            raise fail(f"{_nothing(listing, run)}: nothing sent")
        held = listing.held
        message = (
            f"{_nothing(listing, run)}: nothing sent"
            if not held
            else f"{len(held)} log(s) under {root} for host {host} are held by a live process, "
            "which sends them: nothing sent from here"
        )
        out.print(message, highlight=False, soft_wrap=True)
        return
    report = send_spool(root, chosen, host=host, run_id=run, timeout_s=timeout)
    print_report(report, root, chosen, again="run `rlpulse spool send` again")


def _table(listing: SpoolListing, now_ns: int) -> Table:
    table = Table(box=None, pad_edge=False)
    for name in ("run", "producer", "host", "pid", "log"):
        table.add_column(name, overflow="fold")
    for name in ("events", "records", "disk", "age"):
        table.add_column(name, justify="right", no_wrap=True)
    for logs in listing.runs.values():
        for number, spooled in enumerate(logs, 1):
            table.add_row(
                spooled.run_id,
                spooled.producer_id,
                spooled.host or "?",
                _process(spooled),
                spooled.state,
                str(spooled.events),
                str(spooled.records),
                ByteSize(spooled.disk_bytes).human_readable(),
                _age(spooled.age_s(now_ns)),
                end_section=number == len(logs),
            )
    return table


def _summary(listing: SpoolListing) -> None:
    logs, dead = listing.logs, listing.dead
    out.print(
        f"{len(logs)} log(s) of {len(listing.runs)} run(s) under {listing.root} for host "
        f"{listing.host}: {sum(s.events for s in logs)} event(s) and "
        f"{sum(s.records for s in logs)} record(s) not acknowledged by Kafka",
        highlight=False,
        soft_wrap=True,
    )
    if dead:
        out.print(
            f"{len(dead)} dead log(s) ({sum(s.waiting for s in dead)} record(s)): "
            "`rlpulse spool send` sends them",
            highlight=False,
            soft_wrap=True,
        )
    if listing.held:
        out.print(
            f"{len(listing.held)} log(s) held by a live process, which sends them: "
            "never sent from here",
            highlight=False,
            soft_wrap=True,
        )


def _process(spooled: SpoolLog) -> str:
    if spooled.pid is None:
        return "?"
    return f"{spooled.pid} ({'alive' if spooled.pid_alive else 'gone'})"


def _age(seconds: float | None) -> str:
    """``45s``, ``12m``, ``3h05m``, ``2d04h``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _document(spooled: SpoolLog, now_ns: int) -> dict[str, object]:
    return {
        "run_id": spooled.run_id,
        "producer_id": spooled.producer_id,
        "host": spooled.host,
        "pid": spooled.pid,
        "pid_alive": spooled.pid_alive,
        "state": spooled.state,
        "events": spooled.events,
        "records": spooled.records,
        "disk_bytes": spooled.disk_bytes,
        "created_ns": spooled.created_ns,
        "age_s": spooled.age_s(now_ns),
        "sent_by_spool_send": spooled.state == DEAD,
        "path": str(spooled.path),
    }
