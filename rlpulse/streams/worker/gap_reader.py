"""Reading a range of a partition that faust skipped, with a consumer outside faust's.

faust was seen leaving out a range of a partition around a rebalance: messages its fetch
loop held while its flow was suspended are dropped, and their offsets counted as read. The
worker used to seek faust's consumer back over such a range. That races with the records
the fetch loop already holds for the partition: delivered after the seek, they make faust
count the skipped range as a gap it may commit, and drop the re-read as older than what it
read (seen here: a range skipped at one rebalance, committed by faust, was gone for good at
the next). :class:`GapReader` reads the missing range itself instead, with a consumer that
joins no group and commits nothing, so the agent processes it in order, before the
delivery that revealed the gap, and faust's position is never moved under it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

from confluent_kafka import Message as KafkaMessage
from confluent_kafka import TopicPartition
from faust.types import TP
from faust.types.tuples import Message

from rlpulse.settings import Settings
from rlpulse.transport.clients import new_consumer
from rlpulse.transport.exceptions import TransportError

__all__ = ["GAP_READ_TIMEOUT_S", "GapReadError", "GapReader"]

GAP_READ_TIMEOUT_S: Final = 30.0
"""How long reading one skipped range may take before the worker gives up (and ends)."""


class GapReadError(TransportError):
    """A skipped range of a partition could not be read back in time."""


class GapReader:
    """Reads ``[start, end)`` of one partition as faust messages, one read at a time.

    Each read makes its own consumer and closes it: skipped ranges are rare (a rebalance),
    so nothing is kept open between them. The consumer is in the worker's group id (for the
    brokers' ACLs) but never joins the group and never commits.
    """

    def __init__(
        self, settings: Settings, group_id: str, timeout_s: float = GAP_READ_TIMEOUT_S
    ) -> None:
        self._settings = settings
        self._group_id = group_id
        self._timeout_s = timeout_s

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[Message]:
        """The messages at offsets ``start`` to ``end - 1`` of ``topic``'s ``partition``.

        Offsets the log no longer has (retention deleted them, or a transaction marker
        stands there) are left out. Raises :class:`GapReadError` when the range cannot be
        read within the reader's timeout.
        """
        return await asyncio.to_thread(self._read, topic, partition, start, end)

    def _read(self, topic: str, partition: int, start: int, end: int) -> list[Message]:
        consumer = new_consumer(self._settings, self._group_id, "worker-gap-reader")
        found: list[Message] = []
        deadline = time.monotonic() + self._timeout_s
        try:
            consumer.assign([TopicPartition(topic, partition, start)])
            while (remaining := deadline - time.monotonic()) > 0:
                for record in consumer.consume(min(end - start, 1000), timeout=min(remaining, 1.0)):
                    error = record.error()
                    if error is not None:
                        raise GapReadError(
                            f"{topic} partition {partition}: reading offsets {start}..{end - 1} "
                            f"again failed: {error.str()}"
                        )
                    offset = record.offset()
                    if offset is None:  # only error events have none
                        continue
                    if offset >= end:  # what was there is read (the rest was deleted or markers)
                        return found
                    if offset >= start:
                        found.append(_faust_message(TP(topic, partition), offset, record))
                    if offset == end - 1:
                        return found
        finally:
            consumer.close()
        raise GapReadError(
            f"{topic} partition {partition}: offsets {start}..{end - 1}, skipped by faust, "
            f"could not be read again within {self._timeout_s:g} s ({len(found)} read)"
        )


def _faust_message(tp: TP, offset: int, record: KafkaMessage) -> Message:
    """The record read at ``offset`` of ``tp``, as the faust message the agent handles."""
    kind, milliseconds = record.timestamp()
    headers: Any = record.headers()
    return Message(
        tp.topic,
        tp.partition,
        offset,
        milliseconds / 1000.0,
        kind,
        headers,
        record.key(),
        record.value(),
        None,
        tp=tp,
    )
