"""Creating and checking rlpulse topics on a Kafka cluster."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from rlpulse.schemas.topics import Topics

DEFAULT_PARTITIONS = 6
_LIBRDKAFKA_LOG = logging.getLogger("rlpulse.librdkafka")


def admin_client(bootstrap: str) -> AdminClient:
    """An AdminClient whose librdkafka log lines go to ``logging``, not to stderr."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _LIBRDKAFKA_LOG}
    return AdminClient(config)


def ensure_topics(
    bootstrap: str,
    topics: Topics,
    partitions: int = DEFAULT_PARTITIONS,
    timeout_s: float = 30.0,
) -> None:
    """Create the topics of ``topics`` that do not exist yet.

    The run-keyed topics share one partition count, since the worker's tables are
    co-partitioned with its inputs; an existing topic with another count is an error.
    """
    admin = admin_client(bootstrap)
    existing = admin.list_topics(timeout=timeout_s).topics
    wanted = {name: partitions for name in topics.keyed_by_run()}
    wanted[topics.dlq] = partitions
    wanted[topics.rules] = 1
    for name, count in wanted.items():
        if name in existing and len(existing[name].partitions) != count:
            raise RuntimeError(
                f"topic {name} has {len(existing[name].partitions)} partitions, "
                f"rlpulse needs {count}; delete it or use another --prefix"
            )
    new = [
        NewTopic(
            name,
            num_partitions=count,
            replication_factor=-1,
            config={"cleanup.policy": "compact"} if name == topics.rules else {},
        )
        for name, count in wanted.items()
        if name not in existing
    ]
    if not new:
        return
    for name, future in admin.create_topics(new, request_timeout=timeout_s).items():
        try:
            future.result()
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise RuntimeError(f"could not create topic {name}: {exc}") from exc
    deadline = time.monotonic() + timeout_s
    names = set(wanted)
    while time.monotonic() < deadline:
        metadata = admin.list_topics(timeout=timeout_s).topics
        if names <= set(metadata) and all(
            metadata[n].error is None and len(metadata[n].partitions) == wanted[n] for n in names
        ):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topics {sorted(names)} were not ready after {timeout_s:.0f} s")
