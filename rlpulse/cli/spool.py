"""``rlpulse spool list|send``: what waits on this host in the write-ahead logs, and sending it.

``list`` shows each producer's log under the spool root that this host wrote, per run:
whether its process is alive and holds it, and what Kafka has not acknowledged
(:func:`~rlpulse.producers.delivery.spool.list_spool`). ``send`` sends the dead ones
(:func:`~rlpulse.producers.delivery.spool.send_spool`), or every log under a directory given
(:func:`~rlpulse.producers.delivery.spool.send_logs`: logs copied off their host); a log
another process sends is never sent from here.
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
    err,
    fail,
    one_line_errors,
    out,
    setting_option,
    settings,
)
from rlpulse.producers.delivery.spool import (
    AgentSeen,
    SendReport,
    SpoolListing,
    SpoolLog,
    host_name,
    list_spool,
    send_logs,
    send_spool,
)
from rlpulse.producers.delivery.spool_root import resolve_spool_root
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import bootstrap_servers

spool_app = typer.Typer(
    help="This host's write-ahead logs and the agents that send them; send the rest.",
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
        "--spool-dir",
        shown=lambda chosen: resolve_spool_root(chosen).path,
    ),
]

LogsDir = Annotated[
    Path | None,
    typer.Argument(
        help="Send every log under this directory (searched recursively), of any host unless "
        "--host is given: logs copied off their host. Default: this host's logs under the spool "
        "root."
    ),
]
Prefix = Annotated[
    str | None,
    typer.Option(help="Send to <prefix>.events and <prefix>.logs, not the logs' own topics."),
]
SendTimeout = Annotated[
    float, typer.Option(help="Seconds to wait for Kafka and for the records' delivery.")
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
    json_output: Annotated[
        bool, typer.Option("--json", help="One JSON object per log, then one per agent.")
    ] = False,
    config: ConfigFile = None,
) -> None:
    """List this host's write-ahead logs, per run and producer, and the agents that send them.

    Each log's writer (pid; live while it holds the log, else dead), the process that sends
    it (the host's agent; none: `rlpulse spool send` sends it), the events and text records
    Kafka has not acknowledged, the disk the log takes, and its age. Then each agent kept
    under the spool root: its pid, whether it runs, the cluster and prefix it serves, how many
    logs it sends and its trouble.
    """
    chosen = _chosen(config, spool_dir)
    listing = list_spool(_root(chosen, spool_dir), host or host_name(chosen), run_id=run)
    now_ns = time.time_ns()
    if json_output:
        for spooled in listing.logs:
            typer.echo(json.dumps(_document(spooled, now_ns)))
        for agent in listing.agents:
            typer.echo(json.dumps(_agent_document(agent)))
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
    for agent in listing.agents:
        out.print(_agent_line(agent), highlight=False, soft_wrap=True)


@spool_app.command("send")
@one_line_errors
def spool_send(
    directory: LogsDir = None,
    run: Run = None,
    host: Host = None,
    spool_dir: SpoolDir = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    timeout: SendTimeout = 60.0,
    config: ConfigFile = None,
) -> None:
    """Send what the write-ahead logs that no process sends hold (e.g. after a kill).

    For logs no agent serves (none could start, it exited before Kafka came back, or the
    logs were copied off their host: give their DIR). Logs the host's agent sends are left to
    it. What is already on the topics is read back and not sent again, so every record
    arrives once however often this runs. A dead writer's log sent whole is deleted; each log
    that is not is named with its cause and kept. Exits 0 when every record was sent (or
    nothing waited), 1 when some were not or ``--run`` names a run with no log here.
    """
    chosen = _chosen(config, spool_dir, bootstrap)
    if directory is not None:
        if run is not None or spool_dir is not None:
            raise fail("DIR names the logs to send: --run and --spool-dir apply without it")
        if not directory.exists():
            raise fail(f"{directory} does not exist: nothing to send")
        report = send_logs(directory, chosen, prefix=prefix, timeout_s=timeout, host=host)
        print_report(report, directory, chosen)
        return
    root = _root(chosen, spool_dir)
    host = host or host_name(chosen)
    listing = list_spool(root, host, run_id=run)
    if not listing.unsent:
        if run is not None and not listing.logs:
            raise fail(f"{_nothing(listing, run)}: nothing sent")
        held = listing.held
        senders = ", ".join(sorted({str(spooled.sender) for spooled in held}))
        message = (
            f"{_nothing(listing, run)}: nothing sent"
            if not held
            else f"{len(held)} log(s) under {root} for host {host} are sent by the host's agent "
            f"(pid {senders}): nothing sent from here"
        )
        out.print(message, highlight=False, soft_wrap=True)
        return
    report = send_spool(root, chosen, host=host, run_id=run, prefix=prefix, timeout_s=timeout)
    print_report(report, root, chosen)


def print_report(report: SendReport, root: Path, chosen: Settings) -> None:
    """Say what sending the logs under ``root`` did; exit 1 if it left records unsent."""
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
            "the logs are kept: run `rlpulse spool send` again",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)


def _table(listing: SpoolListing, now_ns: int) -> Table:
    table = Table(box=None, pad_edge=False)
    for name in ("run", "producer", "host", "writer", "sent by"):
        table.add_column(name, overflow="fold")
    for name in ("events", "records", "disk", "age"):
        table.add_column(name, justify="right", no_wrap=True)
    for logs in listing.runs.values():
        for number, spooled in enumerate(logs, 1):
            table.add_row(
                spooled.run_id,
                spooled.producer_id,
                spooled.host or "?",
                _writer(spooled),
                "-" if spooled.sender is None else f"pid {spooled.sender}",
                str(spooled.events),
                str(spooled.records),
                ByteSize(spooled.disk_bytes).human_readable(),
                _age(spooled.age_s(now_ns)),
                end_section=number == len(logs),
            )
    return table


def _summary(listing: SpoolListing) -> None:
    logs, unsent = listing.logs, listing.unsent
    out.print(
        f"{len(logs)} log(s) of {len(listing.runs)} run(s) under {listing.root} for host "
        f"{listing.host}: {sum(s.events for s in logs)} event(s) and "
        f"{sum(s.records for s in logs)} record(s) not acknowledged by Kafka",
        highlight=False,
        soft_wrap=True,
    )
    if unsent:
        out.print(
            f"{len(unsent)} log(s) no agent sends ({sum(s.waiting for s in unsent)} record(s)): "
            "`rlpulse spool send` sends them",
            highlight=False,
            soft_wrap=True,
        )
    if listing.held:
        out.print(
            f"{len(listing.held)} log(s) sent by the host's agent: never sent from here",
            highlight=False,
            soft_wrap=True,
        )


def _writer(spooled: SpoolLog) -> str:
    pid = "?" if spooled.pid is None else str(spooled.pid)
    return f"{pid} ({spooled.state})"


def _agent_line(agent: AgentSeen) -> str:
    serves = f"{agent.bootstrap or '?'} (prefix {agent.prefix or '?'}) on {agent.host or '?'}"
    if not agent.alive:
        return f"agent {agent.directory}: not running (last pid {agent.pid}); served {serves}"
    trouble = f"; trouble: {agent.problem}" if agent.problem else ""
    return f"agent pid {agent.pid} runs: sends {agent.logs} log(s) to {serves}{trouble}"


def _agent_document(agent: AgentSeen) -> dict[str, object]:
    return {
        "agent": str(agent.directory),
        "alive": agent.alive,
        "pid": agent.pid,
        "host": agent.host,
        "bootstrap": agent.bootstrap,
        "prefix": agent.prefix,
        "logs": agent.logs,
        "problem": agent.problem,
    }


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
        "state": spooled.state,
        "sender": spooled.sender,
        "events": spooled.events,
        "records": spooled.records,
        "disk_bytes": spooled.disk_bytes,
        "created_ns": spooled.created_ns,
        "age_s": spooled.age_s(now_ns),
        "sent_by_spool_send": spooled.sender is None,
        "path": str(spooled.path),
    }
