"""Settings for tests that talk to the session's broker, and reading a topic whole."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from rlpulse.schemas.topics import Topics
from rlpulse.settings import ProducerSettings, Settings


def settings_at(bootstrap: str, topics: Topics | None = None, **sections: Any) -> Settings:
    """Settings pointing at ``bootstrap`` (and ``topics``' prefix), with ``sections`` over them.

    Unless ``producer`` is given, spools go to a fresh temporary directory: a test never
    adopts (or leaves) spool files in the machine's rlpulse home.
    """
    if "producer" not in sections:
        spool = Path(tempfile.mkdtemp(prefix="rlpulse-test-spool-"))
        sections["producer"] = ProducerSettings(spool_dir=spool)
    fields: dict[str, Any] = {"bootstrap": bootstrap, **sections}
    if topics is not None:
        fields["prefix"] = topics.prefix
    return Settings(**fields)


def read_all(
    bootstrap: str, topic: str, done: Callable[[list[Any]], bool], timeout_s: float
) -> list[Any]:
    """The messages of ``topic`` from its start, until ``done(messages)`` or ``timeout_s``."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })  # fmt: skip
    consumer.subscribe([topic])
    messages: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not done(messages):
            batch = consumer.consume(500, timeout=0.5)
            messages += [m for m in batch if m.error() is None]
    finally:
        consumer.close()
    return messages


def read_to_end(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[Any]:
    """The messages of ``topic`` from its start to its end as it is now (each partition's high
    watermark when called); fails naming the partitions not read that far in ``timeout_s``.

    For "everything on the topic" once what a test waits for is there: no time window decides
    how much of it is read.
    """
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "enable.partition.eof": False,
    })  # fmt: skip
    deadline = time.monotonic() + timeout_s
    try:
        numbers = sorted(consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions)
        ends: dict[int, int] = {}
        for number in numbers:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, number), timeout=timeout_s
            )
            if high > low:
                ends[number] = high
        consumer.assign([TopicPartition(topic, n, OFFSET_BEGINNING) for n in ends])
        messages: list[Any] = []

        def behind() -> dict[int, tuple[int, int]]:
            """Partition -> (position, end) of each not read to its end yet."""
            positions = consumer.position([TopicPartition(topic, n) for n in ends])
            return {
                p.partition: (p.offset, ends[p.partition])
                for p in positions
                if p.offset < ends[p.partition]
            }

        while ends and behind():
            assert time.monotonic() < deadline, (
                f"{topic} not read to its end in {timeout_s:g} s: (position, end) {behind()}"
            )
            batch = consumer.consume(500, timeout=0.2)
            messages += [m for m in batch if m.error() is None]
    finally:
        consumer.close()
    return messages


def stop_agents(spool: Path, timeout_s: float = 30.0) -> None:
    """SIGTERM the host agents kept under ``spool`` that run, and wait until they exited.

    An agent keeps trying while it has records it could not send (a missing topic, Kafka
    out of reach): a test that leaves it so ends it.
    """
    import os
    import signal

    from rlpulse.producers.delivery.agent_place import agent_alive, agents_under, read_json

    running = [d for d in agents_under(spool) if agent_alive(d / "lock")]
    for directory in running:
        pid = (read_json(directory / "agent.json") or {}).get("pid")
        if isinstance(pid, int):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(agent_alive(d / "lock") for d in running):
        assert time.monotonic() < deadline, f"agents under {spool} did not stop"
        time.sleep(0.1)
