"""Sending spooled events again: what ``rlpulse replay DIR`` does with a dead process's spool."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from rlpulse.producers.spool import SpoolClaim, SpooledEvent, read_spool_file, spool_files
from rlpulse.settings import Settings
from rlpulse.transport.clients import trainer_producer

log = logging.getLogger(__name__)

_FULL_QUEUE_WAIT_S = 0.1


@dataclass
class ReplayReport:
    """What one replay did."""

    files: int = 0
    """Spool files whose events were all delivered (and that were deleted)."""
    delivered: int = 0
    """Events delivered."""
    undelivered: int = 0
    """Events not delivered (their files are kept for a later replay)."""
    unreadable_lines: int = 0
    """Lines skipped because they were not spooled events (a write cut short by a kill)."""
    busy_producers: int = 0
    """Producers whose spool a live process holds (it replays them itself): left alone."""

    @property
    def complete(self) -> bool:
        """Whether nothing was left undelivered."""
        return self.undelivered == 0


def replay_spool(
    directory: Path,
    settings: Settings,
    *,
    topic: str | None = None,
    timeout_s: float = 60.0,
) -> ReplayReport:
    """Send every spooled event under ``directory`` (recursively) again, file by file.

    Each event keeps its key, bytes, ``producer_id`` and ``seq``, so consumers that
    drop duplicates by (producer_id, seq) count it once however often it is replayed.
    ``topic`` overrides the topic recorded with each event. A file is deleted once all
    its events were delivered; the replay stops at the first file that could not be
    delivered within ``timeout_s`` (the broker is likely unreachable). Spools held by
    a live process are skipped.
    """
    report = ReplayReport()
    producer: Producer | None = None
    for (folder, producer_id), paths in spool_files(Path(directory)).items():
        claim = SpoolClaim.take(folder, producer_id)
        if claim is None:
            report.busy_producers += 1
            log.warning("%s: producer %s is alive and replays its own spool", folder, producer_id)
            continue
        try:
            for path in paths:
                events, bad = read_spool_file(path)
                report.unreadable_lines += bad
                if producer is None:
                    producer = trainer_producer(settings, "rlpulse replay")
                delivered = _send(producer, events, topic, timeout_s)
                report.delivered += delivered
                if delivered < len(events):
                    report.undelivered += len(events) - delivered
                    return report
                path.unlink()
                report.files += 1
        finally:
            claim.release()
    return report


def _send(
    producer: Producer, events: list[SpooledEvent], topic: str | None, timeout_s: float
) -> int:
    """Produce ``events`` and wait up to ``timeout_s``; return how many were delivered."""
    outcome = {"delivered": 0}

    def done(error: KafkaError | None, _message: Message) -> None:
        if error is None:
            outcome["delivered"] += 1

    deadline = time.monotonic() + timeout_s
    for event in events:
        while True:
            try:
                producer.produce(
                    topic or event.topic, key=event.key, value=event.value, on_delivery=done
                )
                break
            except BufferError:
                if time.monotonic() > deadline:
                    break
                producer.poll(_FULL_QUEUE_WAIT_S)
            except KafkaException as exc:
                log.warning("librdkafka refused a spooled event: %s", exc)
                break
    if producer.flush(max(0.0, deadline - time.monotonic())):
        producer.purge()
        producer.flush(1.0)
    return outcome["delivered"]
