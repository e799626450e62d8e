"""Joining a consumer group as one member of it: the archiver's and the indexer's consumer.

Kafka spreads the partitions of the subscribed topics over the members; the member is told
through its rebalance callbacks. Static membership (``instance_id``) gives a restarted member
its partitions back at once, without waiting out ``session_timeout_s``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import Consumer, TopicPartition

from rlpulse.settings import Settings
from rlpulse.transport.clients import new_consumer

__all__ = ["Fetching", "Membership", "Rebalance", "join_group"]

Rebalance = Callable[[Consumer, list[TopicPartition]], None]
"""A rebalance callback: partitions assigned, revoked or lost."""


class Membership(Protocol):
    """A process's settings of its group membership (``settings.archive``, ``settings.index``)."""

    @property
    def instance_id(self) -> str | None:
        """Static membership's id; None: a dynamic member."""

    @property
    def session_timeout_s(self) -> float:
        """How long the group waits for a silent member."""


@dataclass(frozen=True)
class Fetching:
    """How a member fetches, and how soon it finds a subscribed topic created after it started."""

    min_bytes: int
    """``fetch.min.bytes``: what the broker gathers before it answers a fetch..."""
    wait_max_ms: int
    """``fetch.wait.max.ms``: ... or how long it waits for that."""
    metadata_refresh_s: float
    """``topic.metadata.refresh.interval.ms``, in seconds."""


def join_group(
    settings: Settings,
    group_id: str,
    client: str,
    topics: list[str],
    membership: Membership,
    fetching: Fetching,
    *,
    on_assign: Rebalance,
    on_revoke: Rebalance,
    on_lost: Rebalance,
    overrides: Mapping[str, object] | None = None,
) -> Consumer:
    """A consumer of ``group_id`` subscribed to ``topics``, with the member's callbacks.

    ``overrides``: further librdkafka properties of this member.
    """
    properties: dict[str, object] = {
        "session.timeout.ms": round(membership.session_timeout_s * 1000),
        "fetch.min.bytes": fetching.min_bytes,
        "fetch.wait.max.ms": fetching.wait_max_ms,
        "topic.metadata.refresh.interval.ms": round(fetching.metadata_refresh_s * 1000),
        **(overrides or {}),
    }
    if membership.instance_id:
        properties["group.instance.id"] = membership.instance_id
    consumer = new_consumer(settings, group_id, client, properties)
    consumer.subscribe(topics, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    return consumer
