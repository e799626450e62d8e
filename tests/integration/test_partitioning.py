"""Every client partitions run-keyed records with murmur2, and a control client reads one partition.

Real broker: a producer built by rlpulse (librdkafka) puts each run's records on the partition
:func:`~rlpulse.transport.partitioning.partition_for` names; a trainer's control client, on a
cluster holding the acks of many runs, reads at start-up only the acks of its run's partition.
"""

from __future__ import annotations

import time
import uuid

import pytest
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from confluent_kafka import KafkaError, Message
from hypothesis import given
from hypothesis import strategies as st

from rlpulse.producers.control.client import ControlClient
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import CommandAck
from rlpulse.schemas.topics import Topics
from rlpulse.transport.clients import new_producer
from rlpulse.transport.partitioning import murmur2, partition_for
from rlpulse.transport.topics import ensure_topics
from tests.kafka import settings_at

PARTITIONS = 6


@given(st.binary(max_size=64))
def test_murmur2_is_faust_and_aiokafkas_hash(key: bytes) -> None:
    assert murmur2(key) == aiokafka_murmur2(key) & 0xFFFFFFFF


@pytest.mark.broker
def test_rlpulse_producers_put_a_run_where_partition_for_says(kafka_bootstrap: str) -> None:
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    settings = settings_at(kafka_bootstrap, topics)
    ensure_topics(settings, topics, partitions=PARTITIONS)
    producer = new_producer(settings, "partition test")
    landed: dict[bytes, int] = {}

    def delivered(error: KafkaError | None, msg: Message) -> None:
        assert error is None, error
        key, partition = msg.key(), msg.partition()
        assert isinstance(key, bytes) and partition is not None
        landed[key] = partition

    keys = [f"run-{n}-{uuid.uuid4().hex[:6]}".encode() for n in range(60)]
    for key in keys:
        producer.produce(topics.acks, key=key, value=b"x", on_delivery=delivered)
    assert producer.flush(30) == 0
    assert landed == {key: partition_for(key, PARTITIONS) for key in keys}
    assert len(set(landed.values())) == PARTITIONS  # 60 runs spread over every partition


@pytest.mark.broker
def test_a_control_client_reads_only_its_runs_partition_at_start_up(kafka_bootstrap: str) -> None:
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    settings = settings_at(kafka_bootstrap, topics)
    ensure_topics(settings, topics, partitions=PARTITIONS)
    codec = default_codec()
    producer = new_producer(settings, "acks of many runs")
    runs = [f"run-{n}-{uuid.uuid4().hex[:6]}" for n in range(40)]
    for run_id in runs:
        for n in range(5):
            ack: CommandAck = {
                "command_id": f"{run_id}-cmd-{n}",
                "run_id": run_id,
                "attempt": 0,
                "status": "applied",
                "applied_at_step": n,
                "detail": {},
                "acked_ns": time.time_ns(),
            }
            producer.produce(
                topics.acks, key=run_id.encode(), value=codec.encode("CommandAck", ack)
            )
    assert producer.flush(30) == 0

    mine = runs[7]
    partition = partition_for(mine.encode(), PARTITIONS)
    on_my_partition = sum(5 for r in runs if partition_for(r.encode(), PARTITIONS) == partition)
    client = ControlClient(mine, settings=settings, startup_timeout_s=30.0)
    try:
        deadline = time.monotonic() + 60
        while not client.started and time.monotonic() < deadline:
            client.poll(timeout_s=0.5)
        assert client.started
        assert client.acked_command_ids == {f"{mine}-cmd-{n}" for n in range(5)}
        assert client.start_up_acks_read == on_my_partition < 5 * len(runs)
    finally:
        client.close()
