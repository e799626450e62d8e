"""A step of many ranks is one state record larger than Kafka's default 1 MiB message limit.

The worker keeps a stage's unreleased steps, every rank's metrics with them, in one record of
its ``joiner-stages`` changelog (about 36 bytes a rank and metric). The first 1,024-rank fleet
(benchmarks/fleet.py, 16 metrics) made records of ~1 MB and the worker exited on
``MessageSizeTooLargeError``. Its changelogs now take ``worker.state_max_bytes`` (16 MiB), and a
worker starting on changelogs made before that raises their limit.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

from rlpulse.local.broker import tail
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.transport.clients import new_admin
from rlpulse.transport.partitioning import partition_for
from rlpulse.transport.replication import Replication
from rlpulse.transport.topics import (
    TopicSpec,
    create_missing,
    ensure_topics,
    raise_message_limits,
)
from tests.integration.topic_reader import read_until
from tests.kafka import settings_at

pytestmark = pytest.mark.broker

RANKS = 320
METRICS = 100
"""320 ranks x 100 metrics: a stage record of ~1.2 MB while the step is open."""
PARTITIONS = 2


def message_limit(bootstrap: str, topic: str) -> int:
    admin = new_admin(settings_at(bootstrap))
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([resource])[resource].result(timeout=30)
    return int(config["max.message.bytes"].value)


def test_raise_message_limits_raises_a_lower_limit_once(kafka_bootstrap: str) -> None:
    topic = f"test-{uuid.uuid4().hex[:10]}-limits"
    admin = new_admin(settings_at(kafka_bootstrap))
    create_missing(admin, {topic: TopicSpec(1, {})}, Replication(1, 1, 1), timeout_s=30.0)
    before = message_limit(kafka_bootstrap, topic)
    wanted = {topic: TopicSpec(1, {"max.message.bytes": str(4 * before)})}
    assert raise_message_limits(admin, wanted, 30.0) == ([topic], [])
    assert message_limit(kafka_bootstrap, topic) == 4 * before
    assert raise_message_limits(admin, wanted, 30.0) == ([], [])
    lower = {topic: TopicSpec(1, {"max.message.bytes": str(before)})}
    assert raise_message_limits(admin, lower, 30.0) == ([], [])  # never lowered
    assert message_limit(kafka_bootstrap, topic) == 4 * before


def _event(run_id: str, rank: int, step: int) -> dict[str, Any]:
    return {
        "kind": "metrics",
        "run_id": run_id,
        "attempt": 0,
        "step": step,
        "stage": "rollout",
        "rank": rank,
        "world_size": RANKS,
        "metrics": {f"metric_{i:03d}": rank + i / 1000 for i in range(METRICS)},
        "tags": {},
        "timestamp_ns": time.time_ns(),
        "producer_id": f"{run_id}/{rank}",
        "seq": step,
    }


def test_a_step_of_many_ranks_is_joined_on_changelogs_made_with_the_default_limit(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The changelogs exist with the broker's 1 MiB limit (an older worker made them); the
    worker raises it, joins two steps whose open state is ~1.2 MB, and stays up."""
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    ensure_topics(settings_at(kafka_bootstrap), topics, partitions=PARTITIONS)
    worker = WorkerProcess(
        kafka_bootstrap, topics.prefix, tmp_path / "worker.log", partitions=PARTITIONS
    )
    stages_changelog = f"{worker.group_id}-joiner-stages-changelog"
    create_missing(
        new_admin(settings_at(kafka_bootstrap)),
        {stages_changelog: TopicSpec(PARTITIONS, {"cleanup.policy": "compact"})},
        Replication(1, 1, 1),
        timeout_s=30.0,
    )
    assert message_limit(kafka_bootstrap, stages_changelog) < 1_100_000
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    codec = default_codec()
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20})
    partition = partition_for(run_id.encode(), PARTITIONS)
    try:
        worker.start().wait_consuming()
        assert "raised max.message.bytes" in worker.log_text(), tail(worker.log_file, 20)
        assert message_limit(kafka_bootstrap, stages_changelog) > 16 * 2**20
        for step in (1, 2):
            for rank in range(RANKS):
                value = codec.encode("TrainerEvent", _event(run_id, rank, step))
                producer.produce(topics.events, value, run_id.encode(), partition=partition)
                producer.poll(0)
        assert producer.flush(30.0) == 0
        found = read_until(
            kafka_bootstrap,
            topics.steps,
            codec.decode_summary,
            lambda got: {s["step"] for s in got} >= {1, 2},
            timeout_s=90.0,
            keep=lambda s: s["run_id"] == run_id,
        )
        assert worker.alive(), tail(worker.log_file, 30)
    finally:
        worker.stop()
    assert "MessageSizeTooLarge" not in worker.log_text()
    for summary in found:
        assert (summary["closed_by"], len(summary["ranks_reported"])) == ("complete", RANKS)
        assert len(summary["metrics"]) == METRICS
