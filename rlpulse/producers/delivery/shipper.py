"""Sending one write-ahead log to Kafka: in order, acknowledged, and never twice to a topic.

A :class:`LogShipper` sends the frames of one producer's log
(:mod:`rlpulse.producers.delivery.wal`), written by another process that may be alive or
gone: each event as its own message to the events topic (the worker joins events one by
one; a batch would hold a command back), consecutive log records as LogBatch messages of at
most ``batch_max_bytes`` to the logs topic, gathered for ``linger_s`` unless an event comes
after them. A samples log's rollout samples and chosen texts go the way log records do, in
SampleBatch and SampleTextBatch messages to their own topics. Events go through one producer
and log batches through another
(:class:`Producers`), so an event never waits behind a batch's request. Every message
carries the producer id and its seqs in headers (:mod:`rlpulse.producers.delivery.readback`)
and the host's clock offset when one is known (:mod:`rlpulse.producers.delivery.clock`). It
records what Kafka acknowledged, in log order, with the counts the writer shows its caller
(the ``acked`` file), and deletes the segments whose every frame arrived, except the newest
one while its writer lives.

After a failed delivery (the broker out of reach for ``producer.delivery_timeout_s``, a
refused write) it sends nothing more of that log, waits for what is in flight, then — once
Kafka answers — reads back what the topics hold of the producer after its last acknowledged
message and sends the rest: nothing is lost, and nothing reaches a topic twice. A log that
another sender began (an agent that was killed) starts that way. Records the broker refuses
as malformed are dropped (counted): sending them again cannot succeed. A frame of a kind
this release does not know stops the log there: it is left in place for a newer sender.

The shipper does no threading of its own: its driver (the host's agent,
:mod:`rlpulse.producers.delivery.agent`, or ``rlpulse spool send``) calls :meth:`LogShipper.step`
and serves the producers' delivery reports in one thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Final

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)

from rlpulse.producers.delivery.clock import CLOCK_HEADER, ClockOffset
from rlpulse.producers.delivery.readback import (
    PRODUCER_HEADER,
    SEQS_HEADER,
    Found,
    found_on_topic,
    seqs_header,
)
from rlpulse.producers.delivery.wal import (
    BATCHED_KINDS,
    EVENT,
    KNOWN_KINDS,
    AckFile,
    AckState,
    Frame,
    LogMeta,
    WalClaim,
    WalReader,
    read_source,
    segment_of,
    segments,
    source_name,
)
from rlpulse.producers.encoding.logs import batch_body
from rlpulse.transport.backoff import Backoff
from rlpulse.transport.partitioning import partition_for
from rlpulse.transport.topics import missing_topic

__all__ = ["PERMANENT_ERRORS", "LogShipper", "Producers"]

log = logging.getLogger(__name__)

FIRST_PROBE_PAUSE_S: Final = 0.5
MAX_PROBE_PAUSE_S: Final = 5.0
PROBE_TIMEOUT_S: Final = 2.0
REPORT_WAIT_S: Final = 2.0
"""How long a report thread waits in librdkafka at a time (its stop is noticed then)."""
ANSWER_FRESH_S: Final = 1.0
"""How long a metadata answer counts as Kafka answering (one probe serves every log)."""
MAX_IN_FLIGHT_BYTES: Final = 64 * 1024 * 1024
"""No more frames are read while this much waits for Kafka's acknowledgement."""
BATCH_MAX_RECORDS: Final = 10_000

PERMANENT_ERRORS: Final = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError._INVALID_ARG,
        KafkaError._BAD_MSG,
    }
)
"""Delivery errors that refuse the message itself: sending it again cannot succeed."""


class Producers:
    """The clients one sender uses for all its logs, and whether Kafka answers.

    One producer for events and one for log batches, each with one request in flight per
    broker (KAFKA-15591, :func:`~rlpulse.transport.clients.trainer_producer`): with two, an
    event's request never waits behind a large batch of log records. One consumer, made on
    first use and kept, reads the topics back for every log. After a failure, Kafka is probed
    once for all logs (:meth:`answering`), with a growing pause: a sender of hundreds of logs
    does not send hundreds of requests to a broker that is down or starved.
    """

    def __init__(
        self, events: Producer, logs: Producer, new_consumer: Callable[[], Consumer]
    ) -> None:
        self.events = events
        self.logs = logs
        self._new_consumer = new_consumer
        self._consumer: Consumer | None = None
        self._reporters: list[threading.Thread] = []
        self._stop_reports = threading.Event()
        self._answered_at = -1.0
        self._next_probe = 0.0
        self._probe_pauses = Backoff(FIRST_PROBE_PAUSE_S, MAX_PROBE_PAUSE_S)
        self.last_error: str | None = None
        """Why the last probe failed (None: it answered)."""

    def poll(self) -> None:
        """Serve both producers' delivery reports in the caller's thread.

        Nothing when :meth:`report_in_background` does.
        """
        if not self._reporters:
            self.events.poll(0)
            self.logs.poll(0)

    def report_in_background(self, arrived: Callable[[], None]) -> None:
        """Serve delivery reports on a thread per producer, each blocked in librdkafka.

        ``arrived()`` is called after each poll that served any: the driver sleeps until
        then instead of looking every few milliseconds while messages are in flight.
        """

        def serve(producer: Producer) -> None:
            while not self._stop_reports.is_set():
                try:
                    if producer.poll(REPORT_WAIT_S):
                        arrived()
                except Exception:  # a report callback's error must not end the reports
                    log.exception("serving delivery reports failed; going on")

        for name, producer in (("events", self.events), ("logs", self.logs)):
            thread = threading.Thread(
                target=serve, args=(producer,), name=f"rlpulse-reports-{name}", daemon=True
            )
            thread.start()
            self._reporters.append(thread)

    def purge(self) -> None:
        """Drop what both still queue (it stays in the write-ahead logs)."""
        for producer in (self.events, self.logs):
            producer.purge()
            producer.poll(0)

    def read_back_consumer(self) -> Consumer:
        """The consumer read-backs use (assigned partitions only, never commits)."""
        if self._consumer is None:
            self._consumer = self._new_consumer()
        return self._consumer

    def answering(self, now: float, topic: str) -> bool:
        """Whether Kafka answers a metadata request for ``topic``.

        Asked at most once a second for every log; after a failure, again after a pause of
        0.5 s doubling to 5 s.
        """
        if now - self._answered_at < ANSWER_FRESH_S:
            return True
        if now < self._next_probe:
            return False
        try:
            self.events.list_topics(topic, timeout=PROBE_TIMEOUT_S)
        except KafkaException as exc:
            self.failed(now, str(exc.args[0].str() if exc.args else exc))
            return False
        self._answered_at = time.monotonic()
        self._probe_pauses.reset()
        self.last_error = None
        return True

    def failed(self, now: float, why: str) -> None:
        """A probe or a read-back failed: wait before the next one, longer each time."""
        self.last_error = why
        self._answered_at = -1.0
        self._next_probe = now + self._probe_pauses.next()

    def close(self) -> None:
        """Stop the report threads and close the read-back consumer.

        The producers go with the last reference.
        """
        self._stop_reports.set()
        for thread in self._reporters:
            thread.join(REPORT_WAIT_S + 1.0)
        self._reporters.clear()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


@dataclass
class _Sent:
    """One message in flight: the log position after its last frame, and its outcome."""

    end: int
    frames: int
    kind: int
    size: int
    produced_ns: int = 0
    done: bool = False
    error: KafkaError | None = None
    partition: int = -1
    offset: int = -1
    resent: bool = False
    found: bool = False


class LogShipper:
    """Sends one producer's write-ahead log; see the module docstring.

    ``claim``: the sender's claim of the log (``ship.lock``), released by :meth:`close`.
    ``clock``: the host's clock offset, fed by the delivery reports and sent as a header.
    """

    def __init__(
        self,
        meta: LogMeta,
        claim: WalClaim | None,
        *,
        batch_max_bytes: int,
        linger_s: float = 0.0,
        clock: ClockOffset | None = None,
    ) -> None:
        self.meta = meta
        self.directory = meta.directory
        self.claim = claim
        self.clock = clock
        began = AckFile.exists(self.directory)
        self._state = AckFile.read(self.directory)
        self._state.created_ns = self._state.created_ns or meta.created_ns
        self._read_at = self._state.position
        self._reader = WalReader(self.directory, meta.protocol)
        self._acks = AckFile(self.directory)
        self._acks.write(self._state)  # before anything is sent: a later sender reads back
        self.failing = began and self._next_frame() is not None
        """Send nothing new until a read-back ran (a log another sender began starts so)."""
        self.last_error: str | None = None
        """Why the last delivery or read-back failed, in a few words."""
        self.last_code: int | None = None
        """librdkafka's code of the delivery error that stopped the log (None: none)."""
        self.unknown_kind: int | None = None
        """The kind of a frame this release does not know, where the log stops (None: none)."""
        self._batch_max_bytes = batch_max_bytes
        self._linger_s = linger_s
        self._key = meta.run_id.encode()
        self._topics = meta.topics()
        self._in_flight: deque[_Sent] = deque()
        self._in_flight_bytes = 0
        self._held_since: float | None = None
        self._resend_end = -1
        """Frames up to this position were produced once already (before a read-back)."""
        self._check: dict[int, Found] | None = None
        self._check_last = -1
        self._heads: dict[int, bytes] = {}
        self._partitions: dict[str, int] = {}

    # -- what the driver asks ----------------------------------------------------------

    @property
    def state(self) -> AckState:
        """What Kafka acknowledged of the log, with the counts."""
        return self._state

    @property
    def in_flight(self) -> bool:
        """Whether messages wait for Kafka's acknowledgement."""
        return bool(self._in_flight)

    @property
    def due_at(self) -> float | None:
        """When the log records held back for the linger must go (monotonic), or None."""
        held = self._held_since
        return None if held is None else held + self._linger_s

    @property
    def delivered_all(self) -> bool:
        """Whether every whole frame of the log (up to now) is done with."""
        if self.failing or self._in_flight:
            return False
        return self._next_frame() is None

    @property
    def stuck(self) -> bool:
        """Whether all that is left waits behind a frame of an unknown kind."""
        return self.unknown_kind is not None and not self._in_flight and not self.failing

    def step(self, producers: Producers, now: float, flush: bool = False) -> bool:
        """Settle what arrived, resume after a failure, send what is new; True if it sent.

        Log records wait for the linger unless ``flush`` or an event comes after them.
        """
        self.settle()
        if self.failing:
            return self._resume(producers, now)
        return self._send(producers, now, flush)

    def close(self, delete: bool) -> None:
        """Unmap the log and release the claim (with ``delete``: remove the log first)."""
        self._reader.close()
        self._acks.close()
        if self.claim is not None:
            self.claim.release(delete=delete)
            self.claim = None

    # -- sending ------------------------------------------------------------------------

    def _next_frame(self) -> Frame | None:
        return next(iter(self._reader.frames(self._read_at)), None)

    def _send(self, producers: Producers, now: float, flush: bool) -> bool:
        """Send the frames after the read position; True if anything was produced.

        Stops early while ``MAX_IN_FLIGHT_BYTES`` wait for acknowledgement, when
        librdkafka's queue is full, or at a frame of an unknown kind; the next step goes on
        from there. Consecutive frames of one batched kind (log records, samples, texts) go
        in one message of at most ``batch_max_bytes``; those at the end are held back until
        the linger passed.
        """
        batch: list[Frame] = []
        batch_bytes = 0
        sent = False
        topics = self._topics
        for frame in self._reader.frames(self._read_at):
            if self._in_flight_bytes >= MAX_IN_FLIGHT_BYTES:
                break
            kind = frame.kind
            if self._check is not None and self._on_topic(frame):
                if batch and not self._produce_batch(producers.logs, batch):
                    return sent
                batch, batch_bytes = [], 0
                self._queue(_Sent(frame.end, 1, kind, 0, done=True, found=True))
                continue
            if batch and batch[0].kind != kind:
                if not self._produce_batch(producers.logs, batch):
                    return sent
                sent = True
                batch, batch_bytes = [], 0
            if kind in BATCHED_KINDS and kind in topics:
                batch.append(frame)
                batch_bytes += len(frame.payload)
                if batch_bytes < self._batch_max_bytes and len(batch) < BATCH_MAX_RECORDS:
                    continue
                if not self._produce_batch(producers.logs, batch):
                    return sent
                sent = True
                batch, batch_bytes = [], 0
            elif kind == EVENT and kind in topics:
                if not self._produce_event(producers.events, frame):
                    return sent
                sent = True
            else:
                self._stop_at(frame)
                return sent
        if batch:
            held = self._held_since
            if flush or self._linger_s <= 0 or (held is not None and now >= held + self._linger_s):
                sent = self._produce_batch(producers.logs, batch) or sent
            elif held is None:
                self._held_since = now
        return sent

    def _stop_at(self, frame: Frame) -> None:
        """A frame this release cannot read: leave it, and all after it, in the log."""
        if self.unknown_kind is None:
            self.unknown_kind = frame.kind
            log.warning(
                "%s: frame kind %d (seq %d) is not one this release reads (%s); it and every "
                "frame after it are left in the log for a newer rlpulse",
                self.directory,
                frame.kind,
                frame.seq,
                ", ".join(str(kind) for kind in sorted(KNOWN_KINDS)),
            )

    def _on_topic(self, frame: Frame) -> bool:
        """Whether the read-back found ``frame`` on its topic (the check ends past the last)."""
        assert self._check is not None
        if frame.seq > self._check_last:
            self._check = None  # younger frames were never sent
            return False
        found = self._check.get(frame.kind)
        return found is not None and found.holds(frame.seq)

    def _produce_event(self, producer: Producer, frame: Frame) -> bool:
        sent = _Sent(frame.end, 1, EVENT, len(frame.payload))
        return self._produce(producer, frame.payload, seqs_header(frame.seq, frame.seq), sent)

    def _produce_batch(self, producer: Producer, batch: list[Frame]) -> bool:
        """One batch message of consecutive frames of one kind, behind that kind's head."""
        self._held_since = None
        kind = batch[0].kind
        head = self._heads.get(kind)
        if head is None:
            head = read_source(self.directory, kind)
            if head is not None:
                self._heads[kind] = head
        if head is None:  # records without the source file: nothing can build their batch
            log.warning(
                "%s holds records of kind %d but no %s file; %d record(s) dropped",
                self.directory,
                kind,
                source_name(kind),
                len(batch),
            )
            self._queue(_Sent(batch[-1].end, len(batch), kind, 0, done=True, error=_NO_SOURCE))
            return True
        value = head + batch_body([frame.payload for frame in batch])
        sent = _Sent(batch[-1].end, len(batch), kind, len(value))
        return self._produce(producer, value, seqs_header(batch[0].seq, batch[-1].seq), sent)

    def _produce(self, producer: Producer, value: bytes, seqs: bytes, sent: _Sent) -> bool:
        """Hand one message to librdkafka; False (nothing sent) when its queue is full."""
        headers: list[tuple[str, str | bytes | None]] = [
            (PRODUCER_HEADER, self.meta.producer_id.encode()),
            (SEQS_HEADER, seqs),
        ]
        clock = self.clock
        if clock is not None and clock.header is not None:
            headers.append((CLOCK_HEADER, clock.header))
        sent.produced_ns = time.time_ns()
        sent.resent = sent.end <= self._resend_end
        try:
            producer.produce(
                self._topics[sent.kind],
                value,
                self._key,
                headers=headers,
                on_delivery=partial(_report, sent, clock),
            )
        except BufferError:
            return False
        except KafkaException as exc:  # refused at once: as a failed delivery
            sent.done, sent.error = True, _as_error(exc)
        self._queue(sent)
        return True

    def _queue(self, sent: _Sent) -> None:
        self._in_flight.append(sent)
        self._in_flight_bytes += sent.size
        self._read_at = sent.end

    # -- acknowledgements ---------------------------------------------------------------

    def settle(self) -> bool:
        """Take the finished messages at the head of the queue, in log order; True if any."""
        state, queue, moved = self._state, self._in_flight, False
        while queue and queue[0].done:
            sent = queue[0]
            error = sent.error
            if error is not None and error.code() not in PERMANENT_ERRORS:
                if not self.failing:
                    self.failing = True
                    self.last_error = f"{error.str()} ({error.name()})"
                    self.last_code = error.code()
                break  # nothing past it counts until the read-back
            queue.popleft()
            self._in_flight_bytes -= sent.size
            if error is not None:
                state.dropped += sent.frames
                if error is not _NO_SOURCE:
                    log.warning(
                        "the broker refused a message of %d record(s) of %s (%s); dropped",
                        sent.frames,
                        self.directory,
                        error.str(),
                    )
            elif sent.found:
                state.found += sent.frames
            else:
                state.delivered_at(sent.kind, sent.partition, sent.offset)
                if sent.resent:
                    state.resent += sent.frames
                else:
                    state.delivered += sent.frames
            state.position = sent.end
            state.frames += sent.frames
            moved = True
        if moved:
            self._acks.write(state)
            self._delete_delivered()
        return moved

    def _delete_delivered(self) -> None:
        """Delete the segments before the acknowledged position's (never the newest one)."""
        done = segment_of(self._state.position)
        for segment in segments(self.directory)[:-1]:
            if segment < done:
                self._reader.forget(segment)
                (self.directory / f"{segment:06d}.wal").unlink(missing_ok=True)

    # -- after a failure ----------------------------------------------------------------

    def _resume(self, producers: Producers, now: float) -> bool:
        """Once nothing is in flight and Kafka answers: read the topics back, send the rest."""
        if any(not sent.done for sent in self._in_flight):
            return False
        if not producers.answering(now, next(iter(self._topics.values()))):
            self.last_error = producers.last_error or self.last_error
            return False
        try:
            check = self._read_back(producers)
        except KafkaException as exc:
            self.last_error = str(exc.args[0].str() if exc.args else exc)
            log.debug("read-back of %s failed: %s", self.directory, exc)
            producers.failed(time.monotonic(), self.last_error)
            return False
        self._check = check
        self._check_last = max(
            (last for found in check.values() for _first, last in found.ranges), default=-1
        )
        self._resend_end = max(self._resend_end, self._read_at)
        self._in_flight.clear()
        self._in_flight_bytes = 0
        self._held_since = None
        self._read_at = self._state.position
        self.failing = False
        self.last_error = self.last_code = None
        return self._send(producers, now, flush=True)

    def _read_back(self, producers: Producers) -> dict[int, Found]:
        """Per frame kind, what its topic holds of this producer after its last acknowledgement."""
        state = self._state
        created_ms = state.created_ns // 1_000_000
        consumer = producers.read_back_consumer()
        check = {}
        for kind, topic in self._topics.items():
            acked_partition, offset = state.last_of(kind)
            partition = (
                acked_partition
                if acked_partition >= 0
                else self._partition(producers.events, topic)
            )
            check[kind] = found_on_topic(
                consumer, topic, partition, self.meta.producer_id, offset, created_ms
            )
        return check

    def _partition(self, producer: Producer, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            metadata = producer.list_topics(topic, timeout=PROBE_TIMEOUT_S).topics.get(topic)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC, missing_topic(topic)))
            count = self._partitions[topic] = len(metadata.partitions)
        return partition_for(self._key, count)


_NO_SOURCE: Final = KafkaError(KafkaError._BAD_MSG, "no source file")
"""The outcome of log records whose batch cannot be built: dropped, as a refused message."""


def _report(sent: _Sent, clock: ClockOffset | None, error: KafkaError | None, msg: Message) -> None:
    """Librdkafka's delivery report of one message (served by a report thread or ``poll``)."""
    if error is None:
        sent.partition = msg.partition() or 0
        sent.offset = msg.offset() or 0
        if clock is not None:
            kind, broker_ms = msg.timestamp()
            if kind == TIMESTAMP_LOG_APPEND_TIME:
                clock.sample(sent.produced_ns, time.time_ns(), broker_ms)
    sent.error = error
    sent.done = True


def _as_error(exc: KafkaException) -> KafkaError:
    if exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return KafkaError(KafkaError._FAIL, str(exc))
