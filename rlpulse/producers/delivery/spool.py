"""What waits on this host in the write-ahead logs, who sends it, and sending the rest.

``rlpulse spool list`` is :func:`list_spool`: each producer's log under the spool root that
this host wrote, with its run, producer, host and process, whether its writer is alive
(:func:`~rlpulse.producers.delivery.wal.claim_held` on ``lock``), which process sends it (the
host's agent, holding ``ship.lock``), and the events and text records after its acknowledged
position; and the agents kept under the root, alive or not, with what each serves and its
trouble. ``rlpulse spool send`` is :func:`send_spool`: the logs no process sends, sent by
:func:`~rlpulse.producers.delivery.replay.replay_logs`, the routine of ``rlpulse replay``.

Looking changes nothing: a read of each log's ``meta.json`` and ``acked`` file, its frames
(counted, not decoded), and shared lock attempts given up at once.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from rlpulse.producers.delivery.agent_place import agent_alive, agents_under, read_json
from rlpulse.producers.delivery.replay import ReplayReport, replay_logs
from rlpulse.producers.delivery.wal import (
    EVENT,
    LOG,
    PROTOCOL,
    SHIP_LOCK_NAME,
    AckFile,
    LogMeta,
    WalReader,
    claim_held,
    logs_under,
    run_wal_dir,
    sender_pid,
)
from rlpulse.settings import Settings

__all__ = [
    "DEAD",
    "LIVE",
    "AgentSeen",
    "LogState",
    "SpoolListing",
    "SpoolLog",
    "host_name",
    "list_spool",
    "send_spool",
]

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
    timeout_s: float = 60.0,
) -> ReplayReport:
    """Send the logs :func:`list_spool` lists that no process sends (the same arguments).

    :func:`~rlpulse.producers.delivery.replay.replay_logs` over the same directory, for
    ``host``: a log the host's agent sends is left to it, a dead writer's log sent whole is
    deleted, one that is not is kept with its cause.
    """
    where = root if run_id is None else run_wal_dir(root, run_id, host)
    return replay_logs(where, settings, timeout_s=timeout_s, host=host)


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
