"""Joining a consumer group, without Kafka: the member's properties and its subscription."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from rlpulse.settings import ArchiveSettings, IndexSettings, Settings
from rlpulse.transport import group
from rlpulse.transport.group import Fetching, join_group

FETCHING = Fetching(min_bytes=1024, wait_max_ms=50, metadata_refresh_s=2.5)


class _Consumer:
    """Stands in for a confluent ``Consumer``: remembers its subscription."""

    def __init__(self, properties: Mapping[str, Any]) -> None:
        self.properties = dict(properties)
        self.subscribed: tuple[list[str], dict[str, Any]] | None = None

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.subscribed = (topics, callbacks)


def _ignore(_consumer: Consumer, _partitions: list[TopicPartition]) -> None:
    pass


def _joined(monkeypatch: pytest.MonkeyPatch, settings: Settings, membership: Any) -> _Consumer:
    built: list[tuple[str, str]] = []

    def fake(
        _settings: Settings, group_id: str, client: str, overrides: Mapping[str, Any]
    ) -> _Consumer:
        built.append((group_id, client))
        return _Consumer(overrides)

    monkeypatch.setattr(group, "new_consumer", fake)
    consumer = join_group(
        settings,
        "unit-group",
        "unit",
        ["a", "b"],
        membership,
        FETCHING,
        on_assign=_ignore,
        on_revoke=_ignore,
        on_lost=_ignore,
        overrides={"enable.partition.eof": False},
    )
    assert built == [("unit-group", "unit")]
    assert isinstance(consumer, _Consumer)
    return consumer


def test_a_static_member_has_its_instance_id_and_its_tuning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    archive = ArchiveSettings(instance_id="archiver-1", session_timeout_s=30)
    consumer = _joined(monkeypatch, Settings(prefix="unit", archive=archive), archive)
    assert consumer.properties == {
        "session.timeout.ms": 30_000,
        "fetch.min.bytes": 1024,
        "fetch.wait.max.ms": 50,
        "topic.metadata.refresh.interval.ms": 2500,
        "enable.partition.eof": False,
        "group.instance.id": "archiver-1",
    }
    assert consumer.subscribed == (
        ["a", "b"],
        {"on_assign": _ignore, "on_revoke": _ignore, "on_lost": _ignore},
    )


def test_a_dynamic_member_has_no_instance_id(monkeypatch: pytest.MonkeyPatch) -> None:
    index = IndexSettings()
    consumer = _joined(monkeypatch, Settings(prefix="unit", index=index), index)
    assert "group.instance.id" not in consumer.properties
    assert consumer.properties["session.timeout.ms"] == round(index.session_timeout_s * 1000)
