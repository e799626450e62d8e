"""Consumer lag per partition: a group's committed offsets against the partitions' ends.

Measured for the worker's group and the exporter's own, the way Kafka's
``kafka-consumer-groups.sh`` does, so a worker that falls behind shows without asking it.
The committed offsets are read with a consumer per group that never joins it
(``Consumer.committed``), not with the admin API's ``list_consumer_group_offsets``: that one
crashes the process (librdkafka 2.x dereferences a missing consumer-group handle when the
answer is NOT_COORDINATOR, as while a broker stops or a coordinator moves; librdkafka issue
5040). The partitions' ends come from one ``list_offsets`` admin request.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from rlpulse.diagnostics import WarnOnce
from rlpulse.settings import Settings
from rlpulse.streams.exporter.state import LagKey
from rlpulse.transport.clients import new_admin, new_consumer
from rlpulse.transport.topics import LATEST_OFFSET

__all__ = ["LagProbe"]

log = logging.getLogger(__name__)


class LagProbe:
    """Measures the lag of ``groups`` on the topics whose names start with ``<prefix>.``."""

    def __init__(self, settings: Settings, groups: Sequence[str], timeout_s: float = 5.0) -> None:
        self.settings = settings
        self.groups = list(groups)
        self.timeout_s = timeout_s
        self._topic_prefix = f"{settings.prefix}."
        self._admin: AdminClient | None = None
        self._readers: dict[str, Consumer] = {}
        self._warn = WarnOnce(log)

    def measure(self) -> dict[LagKey, int] | None:
        """Lag per (group, topic, partition); None when Kafka did not answer.

        Partitions a group has committed nothing on have no entry.
        """
        try:
            return self._measure()
        except (KafkaException, TimeoutError) as exc:
            reason = str(exc) or "no answer in time"
            self._warn(
                "lag", "exporter: consumer lag not measured (Kafka did not answer): %s", reason
            )
            return None

    def _measure(self) -> dict[LagKey, int]:
        if self._admin is None:
            self._admin = new_admin(self.settings, "exporter lag probe")
        for group in self.groups:
            if group not in self._readers:
                self._readers[group] = new_consumer(self.settings, group, f"lag of {group}")
        metadata = self._admin.list_topics(timeout=self.timeout_s)
        partitions = [
            TopicPartition(name, partition)
            for name, topic in sorted(metadata.topics.items())
            if name.startswith(self._topic_prefix)
            for partition in sorted(topic.partitions)
        ]
        if not partitions:
            return {}
        futures = self._admin.list_offsets(
            {TopicPartition(tp.topic, tp.partition): LATEST_OFFSET for tp in partitions},
            request_timeout=self.timeout_s,
        )
        ends = {
            (tp.topic, tp.partition): future.result(timeout=self.timeout_s).offset
            for tp, future in futures.items()
        }
        lag: dict[LagKey, int] = {}
        for group, reader in self._readers.items():
            for tp in reader.committed(partitions, timeout=self.timeout_s):
                end = ends.get((tp.topic, tp.partition))
                if tp.offset >= 0 and end is not None:
                    lag[(group, tp.topic, tp.partition)] = max(0, end - tp.offset)
        return lag

    def close(self) -> None:
        """Close the clients (a later measurement creates new ones)."""
        for reader in self._readers.values():
            try:
                reader.close()
            except (KafkaException, RuntimeError) as exc:
                log.debug("lag probe consumer close: %s", exc)
        self._readers.clear()
        self._admin = None
