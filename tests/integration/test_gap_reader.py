"""GapReader reads a partition's skipped range back from a real broker, as faust messages."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Producer

from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.streams.worker.gap_reader import GapReader, GapReadError

pytestmark = pytest.mark.broker


def produce(bootstrap: str, topic: str, partition: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(
            topic, f"value-{i}".encode(), f"run-{i}".encode(), partition, headers=[("n", b"%d" % i)]
        )
    assert producer.flush(10) == 0


def test_a_skipped_range_is_read_back_in_order_with_keys_and_headers(
    kafka_bootstrap: str, topics: Topics
) -> None:
    produce(kafka_bootstrap, topics.events, 1, 30)
    reader = GapReader(Settings(bootstrap=kafka_bootstrap, prefix=topics.prefix), "gap-test")
    read = asyncio.run(reader.read(topics.events, 1, 7, 19))
    assert [m.offset for m in read] == list(range(7, 19))
    assert [(m.key, m.value) for m in read] == [
        (f"run-{i}".encode(), f"value-{i}".encode()) for i in range(7, 19)
    ]
    assert read[0].headers == [("n", b"7")]
    assert {(m.topic, m.partition, m.tp) for m in read} == {(topics.events, 1, (topics.events, 1))}
    assert not any(m.acked for m in read)  # the agent acks them with its batch


def test_a_range_the_log_does_not_reach_fails_naming_it(
    kafka_bootstrap: str, topics: Topics
) -> None:
    """The worker ends rather than read on past offsets it could not read (its restart will)."""
    produce(kafka_bootstrap, topics.events, 0, 5)
    settings = Settings(bootstrap=kafka_bootstrap, prefix=topics.prefix)
    reader = GapReader(settings, "gap-test", timeout_s=2.0)
    with pytest.raises(GapReadError, match=r"partition 0: offsets 3\.\.9, skipped by faust"):
        asyncio.run(reader.read(topics.events, 0, 3, 10))
