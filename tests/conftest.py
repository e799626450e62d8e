"""Shared fixtures: a real Kafka broker for the whole session, and fresh topic names per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from rlpulse.local.broker import bootstrap_or_local_broker
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.transport.topics import ensure_topics
from tests.kafka import settings_at


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address of a real broker: ``RLPULSE_BOOTSTRAP``, or one started for the session."""
    settings = Settings()
    state_dir = settings.home / f"test-broker-{uuid.uuid4().hex[:8]}"
    with bootstrap_or_local_broker(settings, state_dir) as bootstrap:
        yield bootstrap


@pytest.fixture
def topics(kafka_bootstrap: str) -> Topics:
    """A fresh set of rlpulse topics, created on the session broker."""
    names = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    ensure_topics(settings_at(kafka_bootstrap), names, partitions=3)
    return names
