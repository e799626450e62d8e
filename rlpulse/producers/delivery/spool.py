"""What waits on this host in the write-ahead logs, who sends it, and sending the rest.

``rlpulse spool list`` is :func:`list_spool`: each producer's log under the spool root that
this host wrote, with its run, producer, host and process, whether its writer is alive
(:func:`~rlpulse.producers.delivery.wal.claim_held` on ``lock``), which process sends it (the
host's agent, holding ``ship.lock``), and the events and text records after its acknowledged
position; and the agents kept under the root, alive or not, with what each serves and its
trouble. ``rlpulse spool send`` is :func:`send_logs` (:func:`send_spool` for this host's
logs): for logs no agent serves (none could run, it exited before Kafka came back, the logs
were copied off their host). Each log no other sender holds (its ``ship.lock``) goes through
the agent's :class:`~rlpulse.producers.delivery.shipper.LogShipper`, which reads back what
its topics already hold of the producer and sends only the rest, so every record reaches its
topic once however often this runs. A log whose writer is gone is deleted once sent whole.

Looking changes nothing: a read of each log's ``meta.json`` and ``acked`` file, its frames
(counted, not decoded), and shared lock attempts given up at once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from confluent_kafka import Consumer

from rlpulse.producers.delivery.agent_place import agent_alive, agents_under, read_json
from rlpulse.producers.delivery.shipper import LogShipper, Producers
from rlpulse.producers.delivery.wal import (
    EVENT,
    LOCK_NAME,
    LOG,
    PROTOCOL,
    SHIP_LOCK_NAME,
    AckFile,
    LogMeta,
    WalClaim,
    WalReader,
    claim_held,
    logs_under,
    run_wal_dir,
    sender_pid,
    unsent_frames,
)
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import bootstrap_servers
from rlpulse.transport.clients import ClientDiagnostics, new_consumer, trainer_producer
from rlpulse.transport.roles import control_group_prefix
from rlpulse.transport.topics import missing_topic, topic_exists

__all__ = [
    "DEAD",
    "LIVE",
    "AgentSeen",
    "KeptLog",
    "LogState",
    "SendReport",
    "SpoolListing",
    "SpoolLog",
    "host_name",
    "list_spool",
    "send_logs",
    "send_spool",
]

log = logging.getLogger(__name__)

_POLL_S: Final = 0.05

LogState = Literal["live", "dead"]
LIVE: Final = "live"
"""Its writer is alive and holds the log."""
DEAD: Final = "dead"
"""Its writer is gone (killed, or closed before Kafka took everything): the host's agent sends
what is left and deletes the log, or ``rlpulse spool send`` when no agent runs."""


@dataclass(frozen=True)
class SpoolLog:
    """One producer's write-ahead log and what of it Kafka has not acknowledged."""

    path: Path
    run_id: str
    producer_id: str
    host: str | None
    """The host that wrote it (None: not recorded, a log of an earlier release)."""
    pid: int | None
    """The process that wrote it (None: not recorded)."""
    state: LogState
    """Whether its writer is alive."""
    sender: int | None
    """The pid of the process that sends it now (the host's agent); None: nobody does."""
    events: int
    """Events after the acknowledged position (some may have reached Kafka unacknowledged:
    a sender reads the topics back and does not send those again)."""
    records: int
    """Text log records after the acknowledged position (the same)."""
    disk_bytes: int
    """What the log's files take on disk (segments are reserved whole when made)."""
    created_ns: int | None
    """When the log was made (None: no readable ``meta.json``)."""

    @property
    def waiting(self) -> int:
        """Events and records not acknowledged."""
        return self.events + self.records

    def age_s(self, now_ns: int) -> float | None:
        """Seconds since the log was made, at ``now_ns``; None if that is not known."""
        return None if self.created_ns is None else max(0.0, (now_ns - self.created_ns) / 1e9)


@dataclass(frozen=True)
class AgentSeen:
    """An agent kept under the spool root: what it serves, whether it runs, its trouble."""

    directory: Path
    alive: bool
    pid: int | None
    host: str | None
    bootstrap: str | None
    prefix: str | None
    logs: int
    """Logs it sent when it last said (``status.json``)."""
    problem: str | None
    """Its trouble when it last said (None: none)."""


@dataclass(frozen=True)
class SpoolListing:
    """The logs of one host under one spool root (or one run's directory there)."""

    root: Path
    """The directory looked in."""
    host: str
    logs: tuple[SpoolLog, ...]
    """By run, then by when each was made."""
    other_hosts: int = 0
    """Logs under ``root`` that other hosts wrote: not listed, never sent from here."""
    agents: tuple[AgentSeen, ...] = ()
    """The agents kept under the spool root."""

    @property
    def runs(self) -> dict[str, tuple[SpoolLog, ...]]:
        """The logs per run id, in the listing's order."""
        runs: dict[str, list[SpoolLog]] = {}
        for spooled in self.logs:
            runs.setdefault(spooled.run_id, []).append(spooled)
        return {run_id: tuple(logs) for run_id, logs in runs.items()}

    @property
    def unsent(self) -> tuple[SpoolLog, ...]:
        """The logs no process sends: what :func:`send_spool` sends."""
        return tuple(spooled for spooled in self.logs if spooled.sender is None)

    @property
    def held(self) -> tuple[SpoolLog, ...]:
        """The logs a process sends (the host's agent): never sent from here."""
        return tuple(spooled for spooled in self.logs if spooled.sender is not None)


def host_name(settings: Settings) -> str:
    """The name loggers on this host record (``producer.hostname``, else the system's)."""
    return settings.producer.hostname or socket.gethostname()


def list_spool(
    root: Path, host: str, *, run_id: str | None = None, spool_root: Path | None = None
) -> SpoolListing:
    """The write-ahead logs under ``root`` that ``host`` wrote (``run_id``'s only).

    ``spool_root`` (default ``root``) is where the agents are kept. A log that disappears
    while it is looked at (delivered whole and deleted) is left out.
    """
    where = root if run_id is None else run_wal_dir(root, run_id, host)
    logs: list[SpoolLog] = []
    other_hosts = 0
    for directory in logs_under(where):
        meta = LogMeta.read(directory)
        if meta is not None and meta.host is not None and meta.host != host:
            other_hosts += 1
            continue
        spooled = _look(directory, meta)
        if spooled is not None:
            logs.append(spooled)
    logs.sort(key=lambda spooled: (spooled.run_id, spooled.created_ns or 0, spooled.producer_id))
    agents = tuple(_agent(directory) for directory in agents_under(spool_root or root))
    return SpoolListing(where, host, tuple(logs), other_hosts, agents)


def send_spool(
    root: Path,
    settings: Settings,
    *,
    host: str,
    run_id: str | None = None,
    prefix: str | None = None,
    timeout_s: float = 60.0,
) -> SendReport:
    """Send the logs :func:`list_spool` lists that no process sends (the same arguments).

    :func:`send_logs` over the same directory, for ``host``.
    """
    where = root if run_id is None else run_wal_dir(root, run_id, host)
    return send_logs(where, settings, prefix=prefix, timeout_s=timeout_s, host=host)


@dataclass(frozen=True)
class KeptLog:
    """A write-ahead log that could not be sent whole, and why (it is kept for later)."""

    path: Path
    records: int
    """Records of the log not sent."""
    cause: str
    """Why, in a few words: a missing topic, Kafka out of reach, a delivery error."""


@dataclass
class SendReport:
    """What one :func:`send_logs` did: counts of logs and records, and the logs kept."""

    logs: int = 0
    """Write-ahead logs sent whole (and deleted)."""
    delivered: int = 0
    """Records sent."""
    found: int = 0
    """Records found on their topic already (sent before): not sent again."""
    busy_producers: int = 0
    """Logs another process sends (the host's agent): left alone."""
    other_hosts: int = 0
    """Logs another host wrote (when sending for one ``host``): left alone."""
    live: int = 0
    """Logs whose writer is alive: what they held was sent, the logs stay with their writers."""
    kept: list[KeptLog] = field(default_factory=list)
    """The logs not sent whole, each with its cause."""

    @property
    def undelivered(self) -> int:
        """Records not sent (their logs are kept)."""
        return sum(kept.records for kept in self.kept)

    @property
    def complete(self) -> bool:
        """Whether nothing was left unsent."""
        return not self.kept


def send_logs(
    root: Path,
    settings: Settings,
    *,
    prefix: str | None = None,
    timeout_s: float = 60.0,
    host: str | None = None,
) -> SendReport:
    """Send what every write-ahead log under ``root`` (searched recursively) still holds.

    ``prefix`` sends to ``<prefix>.events`` and ``<prefix>.logs`` instead of the topics each
    log recorded. A log sent whole whose writer is gone is deleted; one that is not — Kafka out
    of reach, a topic missing, not all confirmed within ``timeout_s`` — is kept, with its cause.
    Logs another process sends (the host's agent) are left to it. With ``host``, logs another
    host wrote are left alone (their writer may be alive there).
    """
    report = SendReport()
    diagnostics = ClientDiagnostics("rlpulse spool send", settings, quiet=True)
    producers: Producers | None = None
    shippers: list[LogShipper] = []
    for path in logs_under(Path(root)):
        meta = LogMeta.read(path)
        if meta is None:
            report.kept.append(KeptLog(path, unsent_frames(path), "no readable meta.json"))
            continue
        if host is not None and meta.host is not None and meta.host != host:
            report.other_hosts += 1
            continue
        if meta.protocol > PROTOCOL:
            cause = f"protocol {meta.protocol}: a newer rlpulse writes it"
            report.kept.append(KeptLog(path, unsent_frames(path), cause))
            continue
        claim = WalClaim.take(path, SHIP_LOCK_NAME)
        if claim is None:
            report.busy_producers += 1
            log.info("%s: process %s sends this log", path, sender_pid(path))
            continue
        if prefix is not None:
            topics = Topics(prefix)
            meta = dataclasses.replace(meta, events_topic=topics.events, logs_topic=topics.logs)
        if producers is None:
            producers = Producers(
                trainer_producer(settings, "rlpulse spool send (events)", diagnostics),
                trainer_producer(settings, "rlpulse spool send (logs)", diagnostics),
                lambda: _read_back_consumer(settings),
            )
        problem = _destination_problem(producers, diagnostics, settings, meta, timeout_s)
        if problem is not None:
            report.kept.append(KeptLog(path, unsent_frames(path), problem))
            claim.release()
            continue
        shippers.append(LogShipper(meta, claim, batch_max_bytes=settings.logging.batch_max_bytes))
    if producers is not None:
        _ship(producers, shippers, time.monotonic() + timeout_s)
    for shipper in shippers:
        _finish(shipper, report, timeout_s)
    return report


def _ship(producers: Producers, shippers: list[LogShipper], deadline: float) -> None:
    """Step every shipper until each delivered all, is stuck, or ``deadline`` passes."""
    waiting = list(shippers)
    while waiting and time.monotonic() < deadline:
        producers.poll()
        for shipper in waiting:
            shipper.step(producers, time.monotonic(), flush=True)
        waiting = [s for s in waiting if not (s.delivered_all or s.stuck)]
        time.sleep(_POLL_S)
    producers.purge()
    producers.close()


def _finish(shipper: LogShipper, report: SendReport, timeout_s: float) -> None:
    """Close one log after sending: deleted if sent whole and its writer is gone, else kept."""
    shipper.settle()
    state, path = shipper.state, shipper.directory
    report.delivered += state.delivered + state.resent
    report.found += state.found
    writer_alive = claim_held(path, LOCK_NAME) is True
    if shipper.delivered_all and not writer_alive:
        shipper.close(delete=True)
        report.logs += 1
        return
    if shipper.delivered_all:
        report.live += 1
    else:
        cause = shipper.last_error or f"not confirmed within {timeout_s:g} s"
        if shipper.unknown_kind is not None:
            cause = f"frame kind {shipper.unknown_kind}: a newer rlpulse writes it"
        report.kept.append(KeptLog(path, unsent_frames(path), cause))
    shipper.close(delete=False)


def _destination_problem(
    producers: Producers,
    diagnostics: ClientDiagnostics,
    settings: Settings,
    meta: LogMeta,
    timeout_s: float,
) -> str | None:
    """Why the log's records cannot go to its topics now, or None."""
    wait_s = min(timeout_s, 10.0)
    for topic in (meta.events_topic, meta.logs_topic):
        exists = topic_exists(producers.events, topic, wait_s)
        if exists is None:
            producers.events.poll(0)  # serves the client's error callbacks: they say why
            cause = diagnostics.cause()
            return f"Kafka at {bootstrap_servers(settings)} did not answer within {wait_s:g} s" + (
                f" ({cause})" if cause else ""
            )
        if not exists:
            return missing_topic(topic)
    return None


def _read_back_consumer(settings: Settings) -> Consumer:
    group = f"{control_group_prefix(settings.prefix)}readback"
    return new_consumer(settings, group, "rlpulse spool send read-back")


def _look(directory: Path, meta: LogMeta | None) -> SpoolLog | None:
    """One log as it is now; None if it is gone."""
    writing = claim_held(directory)
    if writing is None:
        return None
    sender = sender_pid(directory) if claim_held(directory, SHIP_LOCK_NAME) else None
    state: LogState = LIVE if writing else DEAD
    try:
        events, records = _waiting(directory, PROTOCOL if meta is None else meta.protocol)
        disk_bytes = sum(entry.stat().st_size for entry in os.scandir(directory) if entry.is_file())
    except FileNotFoundError:  # deleted while looked at
        return None
    if meta is None:  # <root>/<run>/<host>/<producer>, as far as the path says
        return SpoolLog(
            directory, directory.parent.parent.name, directory.name, None, None,
            state, sender, events, records, disk_bytes, None,
        )  # fmt: skip
    return SpoolLog(
        directory, meta.run_id, meta.producer_id, meta.host, meta.pid, state, sender,
        events, records, disk_bytes, meta.created_ns,
    )  # fmt: skip


def _agent(directory: Path) -> AgentSeen:
    """An agent's directory as it is now: its ``agent.json``, ``status.json`` and lock."""
    info = {
        **(read_json(directory / "place.json") or {}),
        **(read_json(directory / "agent.json") or {}),
    }
    status = read_json(directory / "status.json") or {}
    alive = agent_alive(directory / "lock")
    logs = status.get("logs")
    problem = status.get("problem")
    pid = info.get("pid")

    def text(key: str) -> str | None:
        value = info.get(key)
        return value if isinstance(value, str) else None

    return AgentSeen(
        directory,
        alive,
        pid if isinstance(pid, int) else None,
        text("host"),
        text("bootstrap"),
        text("prefix"),
        len(logs) if isinstance(logs, list) and alive else 0,
        problem if isinstance(problem, str) and alive else None,
    )


def _waiting(directory: Path, protocol: int) -> tuple[int, int]:
    """The events and the text records after the log's acknowledged position."""
    reader = WalReader(directory, protocol)
    try:
        kinds = Counter(frame.kind for frame in reader.frames(AckFile.read(directory).position))
    finally:
        reader.close()
    return kinds[EVENT], kinds[LOG]
