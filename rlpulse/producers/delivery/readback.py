"""What a topic already holds of one producer's records: read back before sending again.

A producer's write-ahead log (:mod:`rlpulse.producers.delivery.wal`) records the last message Kafka
acknowledged on each topic. Anything sent after it — by a process killed before it saw the
acknowledgement, or a delivery that timed out on the client but reached the log — may be on
the topic or not. Before such records are sent again, the run's partition is read from just
after the last acknowledged offset to its end, and every message of this producer there is
noted: each carries the producer id and the seqs it holds in its headers
(:data:`PRODUCER_HEADER`, :data:`SEQS_HEADER`), so nothing is decoded. What is found is not
sent again: a record is on its topic exactly once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Final

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

__all__ = ["PRODUCER_HEADER", "SEQS_HEADER", "Found", "found_on_topic", "seqs_header"]

PRODUCER_HEADER: Final = "rlpulse-producer"
"""Header of every message a trainer sends: the producer id of the records it carries."""
SEQS_HEADER: Final = "rlpulse-seqs"
"""Header of every message a trainer sends: ``first-last``, the seqs of its records.

A LogBatch holds every log record of its producer with a seq in that range (the seqs
between that are missing belong to the producer's events); an event holds one seq."""
READ_TIMEOUT_S: Final = 30.0
LOOKBACK_MARGIN_MS: Final = 10 * 60 * 1000
"""With no acknowledged offset, how far before the log's creation the search starts (clocks
of the host and the broker may differ)."""


def seqs_header(first: int, last: int) -> bytes:
    """The value of :data:`SEQS_HEADER` for records ``first`` to ``last``."""
    return f"{first}-{last}".encode()


@dataclass
class Found:
    """The seq ranges of one producer's messages found on one partition."""

    ranges: list[tuple[int, int]] = field(default_factory=list)
    messages: int = 0
    """Messages read (of every producer)."""

    def holds(self, seq: int) -> bool:
        """Whether a message found carries ``seq``."""
        return any(first <= seq <= last for first, last in self.ranges)


def found_on_topic(
    consumer: Consumer,
    topic: str,
    partition: int,
    producer_id: str,
    after_offset: int,
    created_ms: int,
    timeout_s: float = READ_TIMEOUT_S,
) -> Found:
    """The messages of ``producer_id`` on ``topic`` partition ``partition`` after ``after_offset``.

    ``after_offset`` -1 means none was acknowledged: the search starts at the producer's log's
    creation (``created_ms``, less a margin for clock differences). Reads up to the partition's
    end as it is when called. Raises ``KafkaException`` when Kafka does not answer in time.
    """
    tp = TopicPartition(topic, partition)
    if after_offset >= 0:
        start = after_offset + 1
    else:
        (at,) = consumer.offsets_for_times(
            [TopicPartition(topic, partition, max(0, created_ms - LOOKBACK_MARGIN_MS))],
            timeout=timeout_s,
        )
        start = at.offset
    _low, end = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
    found = Found()
    if start == OFFSET_END or start < 0 or start >= end:
        return found
    wanted = producer_id.encode()
    consumer.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            for message in consumer.consume(1000, 0.5):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(error)
                found.messages += 1
                headers = dict(message.headers() or [])
                if headers.get(PRODUCER_HEADER) == wanted:
                    seqs = headers.get(SEQS_HEADER) or b""
                    text = seqs.decode() if isinstance(seqs, bytes) else seqs
                    first, _, last = text.partition("-")
                    if first.isdigit() and last.isdigit():
                        found.ranges.append((int(first), int(last)))
                offset = message.offset()
                if offset is not None and offset + 1 >= end:
                    return found
            if time.monotonic() > deadline:
                raise KafkaException(
                    KafkaError(KafkaError._TIMED_OUT, f"reading {topic} [{partition}] back")
                )
    finally:
        consumer.unassign()
