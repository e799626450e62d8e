"""Settings for tests that talk to the session's broker, and reading a topic whole."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

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
