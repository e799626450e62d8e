"""Reading a topic's records from the beginning until a condition holds (integration tests)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import Consumer, TopicPartition

T = TypeVar("T")


def read_until(
    bootstrap: str,
    topic: str,
    decode: Callable[[bytes], T],
    done: Callable[[list[T]], bool],
    *,
    timeout_s: float = 60.0,
    keep: Callable[[T], bool] = lambda _record: True,
) -> list[T]:
    """Decode ``topic``'s records (every partition, from offset 0) until ``done(kept)``.

    Fails the test with what was read if ``done`` does not hold within ``timeout_s``.
    """
    return read_many_until(
        bootstrap, topic, lambda value: [decode(value)], done, timeout_s=timeout_s, keep=keep
    )


def read_many_until(
    bootstrap: str,
    topic: str,
    decode: Callable[[bytes], list[T]],
    done: Callable[[list[T]], bool],
    *,
    timeout_s: float = 60.0,
    keep: Callable[[T], bool] = lambda _record: True,
) -> list[T]:
    """:func:`read_until` for messages that carry several records (``decode`` gives them all)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    try:
        metadata = consumer.list_topics(topic=topic, timeout=timeout_s)
        partitions = metadata.topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[T] = []
        deadline = time.monotonic() + timeout_s
        while not done(records):
            assert time.monotonic() < deadline, f"{topic}: condition not met by {records!r:.3000}"
            for msg in consumer.consume(500, timeout=0.2):
                assert msg.error() is None, msg.error()
                records += [record for record in decode(msg.value() or b"") if keep(record)]
        return records
    finally:
        consumer.close()
