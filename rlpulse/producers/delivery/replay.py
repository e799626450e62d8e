"""Sending write-ahead logs no agent serves: ``rlpulse replay DIR`` and ``rlpulse spool send``.

The host's agent sends every log of its host by itself, a dead writer's too
(:mod:`rlpulse.producers.delivery.agent`). What is left for this routine: logs whose agent
could not run, logs copied off their host, a run whose host's agent exited before Kafka came
back. :func:`replay_logs` sends each log under a directory that no other sender holds (its
``ship.lock``), with the agent's :class:`~rlpulse.producers.delivery.shipper.LogShipper`: it
reads back what its topics already hold of the producer and sends only the rest, with the
producer's own ids, so every record reaches its topic once however often a replay runs. A
log whose writer is gone is deleted once sent whole; a live writer's log is left to it.
``rlpulse spool send`` is this routine over the logs this host wrote
(:mod:`rlpulse.producers.delivery.spool`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer

from rlpulse.producers.delivery.shipper import LogShipper, Producers
from rlpulse.producers.delivery.wal import (
    LOCK_NAME,
    PROTOCOL,
    SHIP_LOCK_NAME,
    LogMeta,
    WalClaim,
    claim_held,
    logs_under,
    sender_pid,
    unsent_frames,
)
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import bootstrap_servers
from rlpulse.transport.clients import ClientDiagnostics, new_consumer, trainer_producer
from rlpulse.transport.roles import control_group_prefix
from rlpulse.transport.topics import missing_topic, topic_exists

__all__ = ["KeptLog", "ReplayReport", "replay_logs"]

log = logging.getLogger(__name__)

_POLL_S = 0.05


@dataclass(frozen=True)
class KeptLog:
    """A write-ahead log the replay could not send whole, and why (it is kept for later)."""

    path: Path
    records: int
    """Records of the log not sent."""
    cause: str
    """Why, in a few words: a missing topic, Kafka out of reach, a delivery error."""


@dataclass
class ReplayReport:
    """What one replay did."""

    logs: int = 0
    """Write-ahead logs sent whole (and deleted)."""
    delivered: int = 0
    """Records sent."""
    found: int = 0
    """Records found on their topic already (sent before): not sent again."""
    busy_producers: int = 0
    """Logs another process sends (the host's agent): left alone."""
    other_hosts: int = 0
    """Logs another host wrote (a replay for one ``host``): left alone."""
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


def replay_logs(
    root: Path,
    settings: Settings,
    *,
    prefix: str | None = None,
    timeout_s: float = 60.0,
    host: str | None = None,
) -> ReplayReport:
    """Send what every write-ahead log under ``root`` (searched recursively) still holds.

    ``prefix`` sends to ``<prefix>.events`` and ``<prefix>.logs`` instead of the topics each
    log recorded. A log sent whole whose writer is gone is deleted; one that is not — Kafka out
    of reach, a topic missing, not all confirmed within ``timeout_s`` — is kept, with its cause.
    Logs another process sends (the host's agent) are left to it. With ``host``, logs another
    host wrote are left alone (their writer may be alive there).
    """
    report = ReplayReport()
    diagnostics = ClientDiagnostics("rlpulse replay", settings, quiet=True)  # causes: per log
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
                trainer_producer(settings, "rlpulse replay (events)", diagnostics),
                trainer_producer(settings, "rlpulse replay (logs)", diagnostics),
                lambda: _consumer(settings),
            )
        problem = _destination_problem(producers.events, diagnostics, settings, meta, timeout_s)
        if problem is not None:
            report.kept.append(KeptLog(path, unsent_frames(path), problem))
            claim.release()
            continue
        shippers.append(LogShipper(meta, claim, batch_max_bytes=settings.logging.batch_max_bytes))
    deadline = time.monotonic() + timeout_s
    waiting = list(shippers)
    while producers is not None and waiting and time.monotonic() < deadline:
        producers.poll()
        for shipper in waiting:
            shipper.step(producers, time.monotonic(), flush=True)
        waiting = [s for s in waiting if not (s.delivered_all or s.stuck)]
        time.sleep(_POLL_S)
    if producers is not None:
        producers.purge()
        producers.close()
    for shipper in shippers:
        _finish(shipper, report, timeout_s)
    return report


def _finish(shipper: LogShipper, report: ReplayReport, timeout_s: float) -> None:
    """Close one log after the replay: deleted if sent whole and its writer is gone, else kept."""
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
    producer: Producer,
    diagnostics: ClientDiagnostics,
    settings: Settings,
    meta: LogMeta,
    timeout_s: float,
) -> str | None:
    """Why the log's records cannot go to its topics now, or None."""
    wait_s = min(timeout_s, 10.0)
    for topic in (meta.events_topic, meta.logs_topic):
        exists = topic_exists(producer, topic, wait_s)
        if exists is None:
            producer.poll(0)  # serves the client's error callbacks: they say why
            cause = diagnostics.cause()
            return f"Kafka at {bootstrap_servers(settings)} did not answer within {wait_s:g} s" + (
                f" ({cause})" if cause else ""
            )
        if not exists:
            return missing_topic(topic)
    return None


def _consumer(settings: Settings) -> Consumer:
    group = f"{control_group_prefix(settings.prefix)}readback"
    return new_consumer(settings, group, "rlpulse replay read-back")
