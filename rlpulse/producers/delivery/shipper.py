"""Sending one write-ahead log to Kafka: in order, acknowledged, and never twice to a topic.

A :class:`LogShipper` sends the frames of one producer's log
(:mod:`rlpulse.producers.delivery.wal`): each event as its own message to the events topic (the
worker joins events one by one; a batch would hold a command back), consecutive log records as
LogBatch messages of at most ``batch_max_bytes`` to the logs topic. Every message carries the
producer id and its seqs in headers (:mod:`rlpulse.producers.delivery.readback`). It records
what Kafka acknowledged, in log order (the ``acked`` file), and deletes the segments whose
every frame arrived.

After a failed delivery (the broker out of reach for ``producer.delivery_timeout_s``, a
refused write) it sends nothing more of that log, waits for what is in flight, then — once
Kafka answers — reads back what the topics hold of the producer after its last acknowledged
message and sends the rest: nothing is lost, and nothing reaches a topic twice. A log that a
dead process left starts that way. Records the broker refuses as malformed are dropped
(counted): sending them again cannot succeed.

The shipper does no threading of its own: its driver (the logger's sender thread,
:mod:`rlpulse.producers.delivery.sender`, or ``rlpulse replay``) calls :meth:`LogShipper.step` and
serves the producer's delivery reports (``poll``) in one thread.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Final

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from rlpulse.producers.delivery.readback import (
    PRODUCER_HEADER,
    SEQS_HEADER,
    Found,
    found_on_topic,
    seqs_header,
)
from rlpulse.producers.delivery.wal import (
    EVENT,
    LOG,
    AckFile,
    AckState,
    Frame,
    LogMeta,
    WalClaim,
    WalReader,
    WalWriter,
    read_source,
    segment_of,
    segments,
)
from rlpulse.producers.encoding.logs import batch_body
from rlpulse.transport.partitioning import partition_for
from rlpulse.transport.topics import missing_topic

__all__ = ["HANDOVER_MAX", "PERMANENT_ERRORS", "LogShipper", "ShipperCounts"]

log = logging.getLogger(__name__)

FIRST_PROBE_PAUSE_S: Final = 0.5
MAX_PROBE_PAUSE_S: Final = 5.0
PROBE_TIMEOUT_S: Final = 2.0
MAX_IN_FLIGHT_BYTES: Final = 64 * 1024 * 1024
"""No more frames are read while this much waits for Kafka's acknowledgement."""
BATCH_MAX_RECORDS: Final = 10_000
HANDOVER_MAX: Final = 100_000
"""Frames waiting in :attr:`LogShipper.handed` beyond which the caller hands no more over
(the sender reads them from the log instead: memory stays bounded while Kafka is away)."""

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


@dataclass
class ShipperCounts:
    """What happened to one log's records (or, summed, to a logger's)."""

    delivered: int = 0
    """Records Kafka acknowledged on their first delivery."""
    resent: int = 0
    """Records whose first delivery failed, sent again after the read-back."""
    found: int = 0
    """Records the read-back found on their topic (not sent again)."""
    dropped: int = 0
    """Records the broker refused as malformed, or that could not be encoded (never resent)."""


@dataclass
class _Sent:
    """One message in flight: the log position after its last frame, and its outcome."""

    end: int
    frames: int
    kind: int
    size: int
    done: bool = False
    error: KafkaError | None = None
    partition: int = -1
    offset: int = -1


class LogShipper:
    """Sends one producer's write-ahead log; see the module docstring.

    ``writer`` is given for the log of a live logger in this process (frames are read up to
    its :attr:`~rlpulse.producers.delivery.wal.WalWriter.end`); without it the log is a dead
    producer's, read to its last whole frame, and ``claim`` is held for it.
    """

    def __init__(
        self,
        meta: LogMeta,
        new_consumer: Callable[[], Consumer],
        *,
        batch_max_bytes: int,
        writer: WalWriter | None = None,
        claim: WalClaim | None = None,
    ) -> None:
        self.meta = meta
        self.directory = meta.directory
        self.writer = writer
        self.claim = claim
        self.handed: deque[Frame] = deque()
        """Frames the live writer's caller hands over as it appends them (see
        :data:`HANDOVER_MAX`): sent from here without reading the log back."""
        self.counts = ShipperCounts()
        self.acked_frames = 0
        """Frames acknowledged, found on the topics or dropped: done with."""
        self.failing = writer is None
        """Send nothing new until a read-back ran (a dead producer's log starts so)."""
        self.last_error: str | None = None
        """Why the last delivery or read-back failed, in a few words."""
        self.last_code: int | None = None
        """librdkafka's code of the delivery error that stopped the log (None: none)."""
        self._new_consumer = new_consumer
        self._batch_max_bytes = batch_max_bytes
        self._key = meta.run_id.encode()
        self._topics = {EVENT: meta.events_topic, LOG: meta.logs_topic}
        self._reader = WalReader(self.directory)
        self._acks = AckFile(self.directory)
        self._state = AckFile.read(self.directory) if writer is None else AckState()
        self._state.created_ns = self._state.created_ns or meta.created_ns
        self._read_at = self._state.position
        self._in_flight: deque[_Sent] = deque()
        self._in_flight_bytes = 0
        self._check: dict[int, Found] | None = None
        self._check_last = -1
        self._resend_end = -1 if writer is not None else 1 << 62  # a dead producer's: all
        self._head: bytes | None = None
        self._next_probe = 0.0
        self._probe_pause = FIRST_PROBE_PAUSE_S
        self._partitions: dict[str, int] = {}

    # -- driven by the sender thread or the replay --------------------------------------

    @property
    def idle(self) -> bool:
        """Whether nothing is in flight, nothing failed and nothing new was appended."""
        caught_up = self.writer is None or self._read_at >= self.writer.end
        return caught_up and not self._in_flight and not self.failing

    @property
    def delivered_all(self) -> bool:
        """Whether every frame of the log (up to now) is done with."""
        if self.failing or self._in_flight:
            return False
        if self.writer is not None:
            return self._read_at >= self.writer.end
        return next(iter(self._reader.frames(self._read_at)), None) is None

    def step(self, producer: Producer) -> bool:
        """Settle what arrived, resume after a failure, send what is new; True if it moved."""
        moved = self.settle()
        if self.failing:
            self._resume(producer)
        else:
            self._send(producer)
        return moved

    def close(self, delete: bool) -> None:
        """Unmap the log; release a dead producer's claim (with ``delete``: remove the log)."""
        self._reader.close()
        self._acks.close()
        if self.claim is not None:
            self.claim.release(delete=delete)
            self.claim = None

    # -- sending ------------------------------------------------------------------------

    def _send(self, producer: Producer) -> None:
        """Send the frames appended since the last look.

        Stops early while ``MAX_IN_FLIGHT_BYTES`` wait for acknowledgement, or when
        librdkafka's queue is full; the next look goes on from there.
        """
        end = None if self.writer is None else self.writer.end
        if end is not None and self._read_at >= end:
            return
        batch: list[Frame] = []
        batch_bytes = 0
        for frame in self._frames(end):
            if self._in_flight_bytes >= MAX_IN_FLIGHT_BYTES:
                break
            if self._check is not None and self._on_topic(frame):
                if batch and not self._produce_logs(producer, batch):
                    return
                batch, batch_bytes = [], 0
                self.counts.found += 1
                self._done_with(frame, _Sent(frame.end, 1, frame.kind, 0, done=True))
                continue
            if frame.kind == LOG:
                batch.append(frame)
                batch_bytes += len(frame.payload)
                if batch_bytes < self._batch_max_bytes and len(batch) < BATCH_MAX_RECORDS:
                    continue
            if batch and not self._produce_logs(producer, batch):
                return
            batch, batch_bytes = [], 0
            if frame.kind == EVENT and not self._produce_event(producer, frame):
                return
            if frame.kind not in (EVENT, LOG):  # a kind this release does not know
                self.counts.dropped += 1
                self._done_with(frame, _Sent(frame.end, 1, frame.kind, 0, done=True))
        if batch:
            self._produce_logs(producer, batch)

    def _frames(self, end: int | None) -> Iterator[Frame]:
        """The frames after the read position, in log order.

        Handed-over frames come as they are; the rest (not handed over, or sent again after a
        failure) are read from the log.
        """
        at, handed = self._read_at, self.handed
        while handed:
            frame = handed[0]
            if frame.end <= at:  # sent already (read from the log meanwhile)
                handed.popleft()
                continue
            if frame.start > at:  # frames the caller did not hand over: from the log
                yield from self._reader.frames(at, frame.start)
                at = frame.start
            handed.popleft()
            yield frame
            at = frame.end
        if end is None or at < end:
            yield from self._reader.frames(at, end)

    def _done_with(self, frame: Frame, sent: _Sent) -> None:
        self._queue(sent)
        self._read_at = frame.end

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

    def _produce_logs(self, producer: Producer, batch: list[Frame]) -> bool:
        head = self._head = self._head or self._source()
        if head is None:  # records without the source file: nothing can build their batch
            log.warning(
                "%s holds log records but no source file; %d record(s) dropped",
                self.directory,
                len(batch),
            )
            self.counts.dropped += len(batch)
            self._done_with(batch[-1], _Sent(batch[-1].end, len(batch), LOG, 0, done=True))
            return True
        value = head + batch_body([frame.payload for frame in batch])
        sent = _Sent(batch[-1].end, len(batch), LOG, len(value))
        return self._produce(producer, value, seqs_header(batch[0].seq, batch[-1].seq), sent)

    def _source(self) -> bytes | None:
        """The shared head of the log's batches: the live writer's, else the log's file."""
        if self.writer is not None and self.writer.source is not None:
            return self.writer.source
        return read_source(self.directory)

    def _produce(self, producer: Producer, value: bytes, seqs: bytes, sent: _Sent) -> bool:
        """Hand one message to librdkafka; False (nothing sent) when its queue is full."""
        headers: list[tuple[str, str | bytes | None]] = [
            (PRODUCER_HEADER, self.meta.producer_id.encode()),
            (SEQS_HEADER, seqs),
        ]
        try:
            producer.produce(
                self._topics[sent.kind],
                value,
                self._key,
                headers=headers,
                on_delivery=partial(_report, sent),
            )
        except BufferError:
            return False
        except KafkaException as exc:  # refused at once: as a failed delivery
            sent.done, sent.error = True, _as_error(exc)
        self._queue(sent)
        self._read_at = sent.end
        return True

    def _queue(self, sent: _Sent) -> None:
        self._in_flight.append(sent)
        self._in_flight_bytes += sent.size

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
                self.counts.dropped += sent.frames
                log.warning(
                    "the broker refused a message of %d record(s) of %s (%s); they are dropped",
                    sent.frames,
                    self.directory,
                    error.str(),
                )
            elif sent.offset >= 0:
                if sent.kind == EVENT:
                    state.events = (sent.partition, sent.offset)
                else:
                    state.logs = (sent.partition, sent.offset)
                if sent.end <= self._resend_end:
                    self.counts.resent += sent.frames
                else:
                    self.counts.delivered += sent.frames
            state.position = sent.end
            self.acked_frames += sent.frames
            moved = True
        if moved:
            self._acks.write(state)
            self._delete_delivered()
        return moved

    def _delete_delivered(self) -> None:
        done = segment_of(self._state.position)
        live = segments(self.directory) if self.writer is None else list(self.writer.live)
        for segment in live:
            if segment < done:
                self._reader.forget(segment)
                if self.writer is not None:
                    self.writer.remove(segment)
                else:
                    (self.directory / f"{segment:06d}.wal").unlink(missing_ok=True)

    # -- after a failure ----------------------------------------------------------------

    def _resume(self, producer: Producer) -> None:
        """Once nothing is in flight and Kafka answers: read the topics back, send the rest."""
        now = time.monotonic()
        if any(not sent.done for sent in self._in_flight) or now < self._next_probe:
            return
        try:
            check = self._read_back(producer)
        except KafkaException as exc:
            self.last_error = str(exc.args[0].str() if exc.args else exc)
            log.debug("read-back of %s failed: %s", self.directory, exc)
            self._next_probe = time.monotonic() + self._probe_pause
            self._probe_pause = min(self._probe_pause * 2, MAX_PROBE_PAUSE_S)
            return
        self._check = check
        self._check_last = max(
            (last for found in check.values() for _first, last in found.ranges), default=-1
        )
        self._probe_pause = FIRST_PROBE_PAUSE_S
        self._in_flight.clear()
        self._in_flight_bytes = 0
        if self.writer is not None:
            self._resend_end = max(self._resend_end, self._read_at)
        self._read_at = self._state.position
        self.failing = False
        self.last_error = self.last_code = None
        self._send(producer)

    def _read_back(self, producer: Producer) -> dict[int, Found]:
        """Per frame kind, what its topic holds of this producer after its last acknowledgement."""
        state = self._state
        created_ms = state.created_ns // 1_000_000
        producer.list_topics(self._topics[EVENT], timeout=PROBE_TIMEOUT_S)  # Kafka answers?
        consumer = self._new_consumer()
        try:
            check = {}
            for kind, (acked_partition, offset) in ((EVENT, state.events), (LOG, state.logs)):
                topic = self._topics[kind]
                partition = (
                    acked_partition if acked_partition >= 0 else self._partition(producer, topic)
                )
                check[kind] = found_on_topic(
                    consumer, topic, partition, self.meta.producer_id, offset, created_ms
                )
            return check
        finally:
            consumer.close()

    def _partition(self, producer: Producer, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            metadata = producer.list_topics(topic, timeout=PROBE_TIMEOUT_S).topics.get(topic)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC, missing_topic(topic)))
            count = self._partitions[topic] = len(metadata.partitions)
        return partition_for(self._key, count)


def _report(sent: _Sent, error: KafkaError | None, message: Message) -> None:
    """Librdkafka's delivery report of one message (served by the driver's ``poll``)."""
    if error is None:
        sent.partition = message.partition() or 0
        sent.offset = message.offset() or 0
    sent.error = error
    sent.done = True


def _as_error(exc: KafkaException) -> KafkaError:
    if exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return KafkaError(KafkaError._FAIL, str(exc))
