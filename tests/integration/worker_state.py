"""What a worker has made durable, read from Kafka: so a test can crash it at a known point.

A worker's rule state is the changelog of its ``rule-state`` table, and what it has read of
the events topic is its consumer group's committed offsets. A test that waits until both
say "step S was evaluated and its events are committed" and then kills the worker knows the
crash comes after S and before anything later: the restarted worker must go on from there.

What a worker holds is in its output: after each rebalance it says which events partitions
it holds (:func:`holding_lines`, :func:`held_partitions`).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition

from rlpulse.local.worker_process import WorkerProcess
from rlpulse.schemas.topics import Topics
from rlpulse.streams.keys import run_key
from rlpulse.transport.clients import new_admin
from tests.kafka import settings_at


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The end offset of each partition of ``topic`` now."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    try:
        partitions = consumer.list_topics(topic=topic, timeout=30).topics[topic].partitions
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1])
            for p in partitions
        }
    finally:
        consumer.close()


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The offsets ``group`` committed on ``topic`` (-1 where it committed none)."""
    admin = new_admin(settings_at(bootstrap))
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p) for p in range(partitions)]
    )
    result = admin.list_consumer_group_offsets([request])[group].result()
    return {tp.partition: int(tp.offset) for tp in result.topic_partitions}


def rule_states(bootstrap: str, group: str) -> dict[str, Any]:
    """The latest value of every key of the worker's rule-state changelog (read to its end)."""
    topic = f"{group}-rule-state-changelog"
    ends = end_offsets(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    states: dict[str, Any] = {}
    todo = {p for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, 0) for p in todo])
    try:
        deadline = time.monotonic() + 60
        while todo and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is not None:
                    continue
                key = json.loads(message.key() or b"null")
                value = message.value()
                if value is None:
                    states.pop(key, None)
                else:
                    states[key] = json.loads(value)
                partition, offset = message.partition(), message.offset()
                if partition is not None and offset is not None and offset + 1 >= ends[partition]:
                    todo.discard(partition)
    finally:
        consumer.close()
    return states


def wait_until_durable(
    bootstrap: str,
    topics: Topics,
    group: str,
    run_ids: list[str],
    stage: str,
    step: int,
    partitions: int,
    timeout_s: float = 120.0,
) -> None:
    """Block until every run's ``stage`` was evaluated up to ``step`` in the durable rule state
    and the worker group committed every events offset produced so far."""
    ends = end_offsets(bootstrap, topics.events)
    deadline = time.monotonic() + timeout_s
    while True:
        states = rule_states(bootstrap, group)
        evaluated = all(
            states.get(run_key(run_id, 0), {}).get("stages", {}).get(stage, {}).get("last_step")
            == step
            for run_id in run_ids
        )
        committed = committed_offsets(bootstrap, group, topics.events, partitions)
        caught_up = all(committed.get(p, -1) >= end for p, end in ends.items() if end > 0)
        if evaluated and caught_up:
            return
        assert time.monotonic() < deadline, (
            f"not durable after {timeout_s:.0f} s: evaluated={evaluated}, committed={committed}, "
            f"ends={ends}"
        )
        time.sleep(0.5)


def kl_guard_streak(bootstrap: str, group: str, run_id: str) -> int:
    """How many consecutive evaluations kl-guard's condition held, in the durable state."""
    return kl_guard_streaks(bootstrap, group, [run_id])[run_id]


def kl_guard_streaks(bootstrap: str, group: str, run_ids: list[str]) -> dict[str, int]:
    """:func:`kl_guard_streak` of each run, from one read of the changelog."""
    states = rule_states(bootstrap, group)
    return {
        run_id: int(
            states[run_key(run_id, 0)]["stages"]["actor"]["rules"]["kl-guard"]["streak_length"]
        )
        for run_id in run_ids
    }


def holding_lines(worker: WorkerProcess) -> list[str]:
    """The lines ``worker`` said about the events partitions it holds, oldest first."""
    return [line for line in worker.log_text().splitlines() if line.startswith("holding ")]


def last_holding(worker: WorkerProcess) -> str:
    """The last of :func:`holding_lines` ("" before the first)."""
    lines = holding_lines(worker)
    return lines[-1] if lines else ""


def held_partitions(line: str) -> set[int]:
    """The partitions a holding line names (none for a worker that holds none)."""
    found = re.match(r"holding events partitions? ([\d, ]+) of ", line)
    return {int(p) for p in found.group(1).split(", ")} if found else set()
