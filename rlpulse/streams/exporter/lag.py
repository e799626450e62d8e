"""Consumer lag per partition: a group's committed offsets against the partitions' ends.

Measured for the worker's group and the exporter's own with the admin API
(``list_consumer_group_offsets`` and ``list_offsets``), the way Kafka's own
``kafka-consumer-groups.sh`` does, so a worker that falls behind shows without asking it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from rlpulse.oncelog import WarnOnce
from rlpulse.settings import Settings
from rlpulse.streams.exporter.state import LagKey
from rlpulse.transport.clients import new_admin

__all__ = ["LagProbe"]

log = logging.getLogger(__name__)
_warn = WarnOnce(log)
_LATEST: Final[Any] = OffsetSpec.latest()  # type: ignore[no-untyped-call]


class LagProbe:
    """Measures the lag of ``groups`` on the topics whose names start with ``prefix.``."""

    def __init__(self, settings: Settings, groups: Sequence[str], timeout_s: float = 5.0) -> None:
        self.settings = settings
        self.groups = list(groups)
        self.timeout_s = timeout_s
        self._topic_prefix = f"{settings.prefix}."
        self._admin: AdminClient | None = None

    def measure(self) -> dict[LagKey, int] | None:
        """Lag per (group, topic, partition); None when Kafka did not answer.

        A group that has committed nothing (or does not exist) has no entries.
        """
        if self._admin is None:
            self._admin = new_admin(self.settings, "exporter lag probe")
        admin = self._admin
        try:
            committed: dict[tuple[str, str, int], int] = {}
            for group in self.groups:
                request = [ConsumerGroupTopicPartitions(group)]
                future = admin.list_consumer_group_offsets(request, request_timeout=self.timeout_s)[
                    group
                ]
                for tp in future.result(timeout=self.timeout_s).topic_partitions or []:
                    if tp.topic.startswith(self._topic_prefix) and tp.offset >= 0:
                        committed[(group, tp.topic, tp.partition)] = tp.offset
            partitions = {(topic, partition) for _group, topic, partition in committed}
            if not partitions:
                return {}
            ends_futures = admin.list_offsets(
                {TopicPartition(t, p): _LATEST for t, p in partitions},
                request_timeout=self.timeout_s,
            )
            ends = {
                (tp.topic, tp.partition): future.result(timeout=self.timeout_s).offset
                for tp, future in ends_futures.items()
            }
        except (KafkaException, TimeoutError) as exc:
            _warn("lag", "exporter: consumer lag not measured (Kafka did not answer): %s", exc)
            return None
        return {
            (group, topic, partition): max(0, ends[(topic, partition)] - offset)
            for (group, topic, partition), offset in committed.items()
            if (topic, partition) in ends
        }
