"""Sending what dead producers left: ``rlpulse replay DIR`` over their write-ahead logs.

A trainer's own next process on the host sends what a dead process of its run left, by itself
(:mod:`rlpulse.producers.delivery.adoption`); ``rlpulse replay`` does it for a run that does not
come back, with the same :class:`~rlpulse.producers.delivery.adoption.DeadLogs`: each log reads back
what its topics already hold of the producer and sends only the rest, with the producer's own ids,
so every record reaches its topic once, however often a replay runs. ``rlpulse spool send`` is the
same replay over the logs this host wrote (:mod:`rlpulse.producers.delivery.spool`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer

from rlpulse.producers.delivery.adoption import DeadLog, DeadLogs, PassedLog, look_for_dead_logs
from rlpulse.producers.delivery.wal import LogMeta, logs_under, unsent_frames
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
    """Records found on their topic already (sent before the producer died): not sent again."""
    busy_producers: int = 0
    """Logs a live process holds (it sends them itself): left alone."""
    other_hosts: int = 0
    """Logs another host wrote (a replay for one ``host``): left alone."""
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
    log recorded. A log sent whole is deleted; one that is not — Kafka out of reach, a topic
    missing, not all confirmed within ``timeout_s`` — is kept, with its cause. Logs held by a
    live process are skipped; with ``host``, so are the logs another host wrote
    (:func:`~rlpulse.producers.delivery.adoption.written_on`), as a logger's adoption skips them.
    """
    report = ReplayReport()
    dead = DeadLogs(lambda: _consumer(settings), settings.logging.batch_max_bytes, "rlpulse replay")
    diagnostics = ClientDiagnostics("rlpulse replay", settings, quiet=True)
    producer = None
    for found in look_for_dead_logs(logs_under(Path(root)), host):
        if isinstance(found, PassedLog):
            _count_passed(report, found)
            continue
        meta, claim = found.meta, found.claim
        if prefix is not None:
            topics = Topics(prefix)
            meta = dataclasses.replace(meta, events_topic=topics.events, logs_topic=topics.logs)
        if producer is None:
            producer = trainer_producer(settings, "rlpulse replay", diagnostics)
        problem = _destination_problem(producer, diagnostics, settings, meta, timeout_s)
        if problem is not None:
            report.kept.append(KeptLog(meta.directory, unsent_frames(meta.directory), problem))
            claim.release()
            continue
        dead.add(DeadLog(meta, claim))
    deadline = time.monotonic() + timeout_s
    while producer is not None and not dead.idle and time.monotonic() < deadline:
        producer.poll(_POLL_S)
        dead.step(producer)
    if producer is not None:
        producer.purge()
        producer.poll(0)
    for path, records, cause in dead.close():
        report.kept.append(KeptLog(path, records, cause or f"not confirmed within {timeout_s:g} s"))
    report.logs = dead.sent_logs
    report.delivered = dead.counts.resent + dead.counts.delivered
    report.found = dead.counts.found
    return report


def _count_passed(report: ReplayReport, passed: PassedLog) -> None:
    """Note in ``report`` a log the replay's look did not claim."""
    if passed.reason == "no meta":
        records = unsent_frames(passed.path)
        report.kept.append(KeptLog(passed.path, records, "no readable meta.json"))
    elif passed.reason == "other host":
        report.other_hosts += 1
    else:
        report.busy_producers += 1
        log.warning("%s: a live process holds this log and sends it itself", passed.path)


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
