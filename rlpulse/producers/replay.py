"""Sending spooled events again: what ``rlpulse replay DIR`` does with a dead process's spool."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from rlpulse.producers.spool import SpoolClaim, SpooledEvent, read_spool_file, spool_files
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import bootstrap_servers
from rlpulse.transport.clients import ClientDiagnostics, trainer_producer
from rlpulse.transport.topics import missing_topic, topic_exists

log = logging.getLogger(__name__)

_FULL_QUEUE_WAIT_S = 0.1
_PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)


@dataclass(frozen=True)
class KeptFile:
    """A spool file the replay could not deliver, and why (it is kept for a later replay)."""

    path: Path
    events: int
    """Events of the file not delivered."""
    cause: str
    """Why, in a few words: a missing topic, the broker out of reach, a delivery error."""


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
    kept: list[KeptFile] = field(default_factory=list)
    """The files not delivered, each with its cause, in the order they were met."""

    @property
    def complete(self) -> bool:
        """Whether nothing was left undelivered."""
        return self.undelivered == 0

    def keep(self, path: Path, events: int, cause: str) -> None:
        """Count ``events`` of ``path`` as not delivered, for ``cause``."""
        self.undelivered += events
        self.kept.append(KeptFile(path, events, cause))


class _Destinations:
    """Whether each topic exists, asked once per topic; and whether Kafka answers at all."""

    def __init__(
        self,
        producer: Producer,
        diagnostics: ClientDiagnostics,
        settings: Settings,
        timeout_s: float,
    ) -> None:
        self._producer = producer
        self._diagnostics = diagnostics
        self._timeout_s = timeout_s
        self._where = f"Kafka at {bootstrap_servers(settings)}"
        self._problems: dict[str, str | None] = {}
        self.unreachable: str | None = None
        """Why Kafka did not answer, once it did not (then no other file is tried)."""

    def problem(self, topic: str) -> str | None:
        """Why events cannot go to ``topic``, or None."""
        if self.unreachable is not None:
            return self.unreachable
        if topic not in self._problems:
            self._problems[topic] = self._ask(topic)
        return self._problems[topic]

    def _ask(self, topic: str) -> str | None:
        exists = topic_exists(self._producer, topic, self._timeout_s)
        if exists is None:
            self._producer.poll(0)  # serves the client's error callbacks: they say why
            cause = self._diagnostics.cause()
            self.unreachable = f"{self._where} did not answer within {self._timeout_s:g} s" + (
                f" ({cause})" if cause else ""
            )
            return self.unreachable
        return None if exists else missing_topic(topic)


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
    its events were delivered. A file that cannot be delivered -- its topic does not
    exist, or not every event was confirmed within ``timeout_s`` -- is kept, with its
    cause in :attr:`ReplayReport.kept`, and so are the later files of the same producer
    (the joiner needs each producer's events in order); other producers' files are still
    sent. Once Kafka does not answer at all, the remaining files are kept with that cause
    at once. Spools held by a live process are skipped.
    """
    report = ReplayReport()
    producer: Producer | None = None
    destinations: _Destinations | None = None
    for (folder, producer_id), paths in spool_files(Path(directory)).items():
        claim = SpoolClaim.take(folder, producer_id)
        if claim is None:
            report.busy_producers += 1
            log.warning("%s: producer %s is alive and replays its own spool", folder, producer_id)
            continue
        try:
            blocked: Path | None = None
            for path in paths:
                events, bad = read_spool_file(path)
                report.unreadable_lines += bad
                if blocked is not None:
                    report.keep(path, len(events), f"waits behind {blocked.name} (kept in order)")
                    continue
                if producer is None:
                    diagnostics = ClientDiagnostics("rlpulse replay", settings, quiet=True)
                    producer = trainer_producer(settings, "rlpulse replay", diagnostics)
                    destinations = _Destinations(
                        producer, diagnostics, settings, min(timeout_s, 10.0)
                    )
                assert destinations is not None
                problem = next(
                    filter(None, map(destinations.problem, {topic or e.topic for e in events})),
                    None,
                )
                if problem is not None:
                    report.keep(path, len(events), problem)
                    blocked = path
                    continue
                delivered, error = _send(producer, events, topic, timeout_s)
                report.delivered += delivered
                if delivered < len(events):
                    cause = error or f"not confirmed within {timeout_s:g} s"
                    report.keep(path, len(events) - delivered, cause)
                    blocked = path
                    continue
                path.unlink()
                report.files += 1
        finally:
            claim.release()
    return report


def _send(
    producer: Producer, events: list[SpooledEvent], topic: str | None, timeout_s: float
) -> tuple[int, str | None]:
    """Produce ``events``, wait up to ``timeout_s``: how many were delivered, the first error."""
    outcome: dict[str, int] = {"delivered": 0}
    errors: list[str] = []

    def done(error: KafkaError | None, _message: Message) -> None:
        if error is None:
            outcome["delivered"] += 1
        elif not errors and error.code() not in _PURGED:  # purged: our own timeout
            errors.append(f"{error.str()} ({error.name()})")

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
                errors.append(f"librdkafka refused it: {exc}")
                break
    if producer.flush(max(0.0, deadline - time.monotonic())):
        producer.purge()
        producer.flush(1.0)
    return outcome["delivered"], errors[0] if errors else None
