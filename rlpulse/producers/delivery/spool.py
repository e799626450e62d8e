"""What waits on this host in the write-ahead logs, per run and producer, and sending it.

``rlpulse spool list`` is :func:`list_spool`: each producer's log under the spool root that
this host wrote (:func:`~rlpulse.producers.delivery.adoption.written_on`), with its run, producer,
host and process, whether a live process holds its claim
(:func:`~rlpulse.producers.delivery.wal.claim_held`), and the events and text records after its
acknowledged position. ``rlpulse spool send`` is :func:`send_spool`: the dead logs among them
sent by :func:`~rlpulse.producers.delivery.replay.replay_logs`, the routine of ``rlpulse
replay`` (its claim skips a log a live process holds, and its read-back sends each record
once).

Looking changes nothing: a read of each log's ``meta.json`` and ``acked`` file, its frames
(counted, not decoded), and a shared lock attempt given up at once.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from rlpulse.producers.delivery.adoption import written_on
from rlpulse.producers.delivery.replay import ReplayReport, replay_logs
from rlpulse.producers.delivery.wal import (
    EVENT,
    LOG,
    AckFile,
    LogMeta,
    WalReader,
    claim_held,
    logs_under,
    run_wal_dir,
)
from rlpulse.settings import Settings

__all__ = [
    "ADOPTED",
    "DEAD",
    "LIVE",
    "LogState",
    "SpoolListing",
    "SpoolLog",
    "host_name",
    "list_spool",
    "send_spool",
]

LogState = Literal["live", "adopted", "dead"]
LIVE: Final = "live"
"""Its process is alive and holds the log: it sends the log itself."""
ADOPTED: Final = "adopted"
"""Its process is gone and another one holds the log and sends it: a logger of the run that
adopted it, or a replay."""
DEAD: Final = "dead"
"""No process holds the log (its process was killed, or closed its logger before Kafka took
everything): ``rlpulse spool send``, or the run's next process on the host, sends it."""


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
    pid_alive: bool | None
    """Whether that process is still running (None: no pid recorded)."""
    state: LogState
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
class SpoolListing:
    """The logs of one host under one spool root (or one run's directory there)."""

    root: Path
    """The directory looked in."""
    host: str
    logs: tuple[SpoolLog, ...]
    """By run, then by when each was made."""
    other_hosts: int = 0
    """Logs under ``root`` that other hosts wrote: not listed, never sent from here."""

    @property
    def runs(self) -> dict[str, tuple[SpoolLog, ...]]:
        """The logs per run id, in the listing's order."""
        runs: dict[str, list[SpoolLog]] = {}
        for spooled in self.logs:
            runs.setdefault(spooled.run_id, []).append(spooled)
        return {run_id: tuple(logs) for run_id, logs in runs.items()}

    @property
    def dead(self) -> tuple[SpoolLog, ...]:
        """The logs no process holds: what :func:`send_spool` sends."""
        return tuple(spooled for spooled in self.logs if spooled.state == DEAD)

    @property
    def held(self) -> tuple[SpoolLog, ...]:
        """The logs a live process holds (and sends): never sent from here."""
        return tuple(spooled for spooled in self.logs if spooled.state != DEAD)


def host_name(settings: Settings) -> str:
    """The name loggers on this host record (``producer.hostname``, else the system's)."""
    return settings.producer.hostname or socket.gethostname()


def list_spool(root: Path, host: str, *, run_id: str | None = None) -> SpoolListing:
    """The write-ahead logs under spool root ``root`` that ``host`` wrote (``run_id``'s only).

    A log that disappears while it is looked at (delivered whole and deleted) is left out.
    """
    where = root if run_id is None else run_wal_dir(root, run_id, host)
    logs: list[SpoolLog] = []
    other_hosts = 0
    for directory in logs_under(where):
        meta = LogMeta.read(directory)
        if meta is not None and not written_on(meta, host):
            other_hosts += 1
            continue
        spooled = _look(directory, meta)
        if spooled is not None:
            logs.append(spooled)
    logs.sort(key=lambda spooled: (spooled.run_id, spooled.created_ns or 0, spooled.producer_id))
    return SpoolListing(where, host, tuple(logs), other_hosts)


def send_spool(
    root: Path,
    settings: Settings,
    *,
    host: str,
    run_id: str | None = None,
    timeout_s: float = 60.0,
) -> ReplayReport:
    """Send the dead logs :func:`list_spool` lists (the same arguments), as a replay does.

    :func:`~rlpulse.producers.delivery.replay.replay_logs` over the same directory, for ``host``: a
    log a live process holds is skipped, a log sent whole is deleted, one that is not is kept
    with its cause.
    """
    where = root if run_id is None else run_wal_dir(root, run_id, host)
    return replay_logs(where, settings, timeout_s=timeout_s, host=host)


def _look(directory: Path, meta: LogMeta | None) -> SpoolLog | None:
    """One log as it is now; None if it is gone."""
    held = claim_held(directory)
    if held is None:
        return None
    pid = None if meta is None else meta.pid
    alive = None if pid is None else _alive(pid)
    state: LogState = DEAD
    if held:
        state = ADOPTED if alive is False else LIVE
    try:
        events, records = _waiting(directory)
        disk_bytes = sum(entry.stat().st_size for entry in os.scandir(directory) if entry.is_file())
    except FileNotFoundError:  # deleted while looked at
        return None
    if meta is None:  # <root>/<run>/<host>/<producer>, as far as the path says
        return SpoolLog(
            directory, directory.parent.parent.name, directory.name, None, None, None,
            state, events, records, disk_bytes, None,
        )  # fmt: skip
    return SpoolLog(
        directory, meta.run_id, meta.producer_id, meta.host, pid, alive, state,
        events, records, disk_bytes, meta.created_ns,
    )  # fmt: skip


def _waiting(directory: Path) -> tuple[int, int]:
    """The events and the text records after the log's acknowledged position."""
    reader = WalReader(directory)
    try:
        kinds = Counter(frame.kind for frame in reader.frames(AckFile.read(directory).position))
    finally:
        reader.close()
    return kinds[EVENT], kinds[LOG]


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (signal 0 is sent to nobody)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
