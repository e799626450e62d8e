"""The worker's Outbox hands records to faust's own producer: they arrive as sent."""

from __future__ import annotations

import asyncio
import uuid

import faust
import pytest
from confluent_kafka import Consumer, TopicPartition

from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.streams.worker.outbox import Outbox
from rlpulse.transport.clients import faust_broker_options

pytestmark = pytest.mark.broker


Record = tuple[int | None, bytes | None, bytes | None, dict[str, object]]


def read_back(bootstrap: str, topic: str, partitions: int, count: int) -> list[Record]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    found: list[Record] = []
    try:
        for _ in range(200):
            for message in consumer.consume(100, timeout=0.2):
                assert message.error() is None, message.error()
                headers: dict[str, object] = dict(message.headers() or [])
                found.append((message.partition(), message.key(), message.value(), headers))
            if len(found) >= count:
                break
    finally:
        consumer.close()
    return found


def test_records_arrive_with_their_keys_partitions_and_headers(
    kafka_bootstrap: str, topics: Topics
) -> None:
    settings = Settings(bootstrap=kafka_bootstrap, prefix=topics.prefix)
    app = faust.App(
        f"outbox-{uuid.uuid4().hex[:8]}", **faust_broker_options(settings), autodiscover=False
    )
    outbox = Outbox(app)
    records = [
        (f"run-{i % 7}".encode(), f"value-{i}".encode(), i % 3, [("n", str(i).encode())])
        for i in range(300)
    ]

    async def send_all() -> None:
        try:
            deliveries = [
                await outbox.send(topics.steps, key, value, partition, headers)
                for key, value, partition, headers in records
            ]
            await asyncio.gather(*deliveries)
        finally:
            await app.producer.stop()

    asyncio.run(send_all())
    found = read_back(kafka_bootstrap, topics.steps, 3, len(records))
    expected: list[Record] = [
        (partition, key, value, dict(headers)) for key, value, partition, headers in records
    ]
    assert sorted(found, key=by_value) == sorted(expected, key=by_value)


def by_value(record: Record) -> bytes:
    return record[2] or b""
