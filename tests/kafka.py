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
