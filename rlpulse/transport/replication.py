"""How many copies of each topic the cluster keeps: chosen once, checked at start-up.

Every topic rlpulse creates (its own and faust's changelogs and assignor topic) is created with
an explicit replication factor and a ``min.insync.replicas`` that makes an acknowledged write
durable: the ``replication_factor`` setting, else ``min(3, brokers)``. (Not the cluster's
``default.replication.factor``: reading a broker's configuration needs ``DescribeConfigs`` on
the cluster, which no rlpulse role has on a secured cluster, and 3 is what that default is on
a production cluster.) A topic left at fewer replicas on a multi-broker cluster
(an earlier worker's changelog made with faust's default of 1) freezes every run on its
partitions while one broker is down, and loses state with that broker's disk: the worker warns
at start-up with the commands that fix it (:func:`under_replicated`, :func:`fix_commands`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from rlpulse.settings import Settings
from rlpulse.transport.exceptions import BrokerUnavailableError, TopicError

__all__ = ["Replication", "UnderReplicated", "cluster_replication", "fix_commands"]

MIN_INSYNC_KEY: Final = "min.insync.replicas"


@dataclass(frozen=True, slots=True)
class Replication:
    """The replication rlpulse creates topics with on one cluster."""

    brokers: int
    factor: int
    min_insync: int

    def topic_config(self) -> dict[str, str]:
        """The topic-level settings every topic rlpulse creates carries."""
        return {MIN_INSYNC_KEY: str(self.min_insync)}


@dataclass(frozen=True, slots=True)
class UnderReplicated:
    """A topic with fewer replicas than rlpulse wants: ``replicas`` per partition now."""

    topic: str
    replicas: dict[int, list[int]]


def min_insync_for(factor: int) -> int:
    """Replicas a write must reach: 2 of 3 (one broker may fail), 1 with fewer copies."""
    return 2 if factor >= 3 else 1


def cluster_replication(
    settings: Settings, admin: AdminClient, timeout_s: float = 10.0
) -> Replication:
    """The replication for ``settings`` on the cluster ``admin`` talks to.

    Raises :class:`TopicError` when ``replication_factor`` asks for more copies than the
    cluster has brokers, :class:`BrokerUnavailableError` when the cluster does not answer.
    """
    try:
        nodes = sorted(admin.list_topics(timeout=timeout_s).brokers)
    except KafkaException as exc:
        raise BrokerUnavailableError(f"Kafka did not answer a metadata request: {exc}") from exc
    brokers = max(1, len(nodes))
    factor = settings.replication_factor
    if factor is None:
        factor = min(3, brokers)
    elif factor > brokers:
        raise TopicError(
            f"replication_factor {factor} needs {factor} brokers; the cluster has {brokers}"
        )
    return Replication(brokers=brokers, factor=factor, min_insync=min_insync_for(factor))


def under_replicated(
    metadata: dict[str, Any], names: list[str], replication: Replication
) -> list[UnderReplicated]:
    """The topics of ``names`` in ``metadata`` (``list_topics().topics``) with too few replicas.

    Only on a multi-broker cluster: on one broker every topic has one replica by necessity.
    """
    if replication.brokers < 2:
        return []
    found = []
    for name in names:
        topic = metadata.get(name)
        if topic is None or topic.error is not None or not topic.partitions:
            continue
        replicas = {int(p): list(part.replicas) for p, part in topic.partitions.items()}
        if min(len(r) for r in replicas.values()) < replication.factor:
            found.append(UnderReplicated(name, replicas))
    return found


def fix_commands(
    topics: list[UnderReplicated],
    replication: Replication,
    broker_ids: list[int],
    bootstrap: str,
    plan_file: Path,
) -> list[str]:
    """Write a reassignment plan to ``plan_file``; return Kafka's commands that apply it.

    Each partition keeps its replicas and gains the next brokers (in id order) until it has
    ``replication.factor``; then each topic gets its ``min.insync.replicas``.
    """
    ordered = sorted(broker_ids)
    partitions = []
    for topic in topics:
        for partition, current in sorted(topic.replicas.items()):
            wanted = list(current)
            start = ordered.index(current[0]) if current and current[0] in ordered else 0
            for step in range(1, len(ordered) + 1):
                if len(wanted) >= replication.factor:
                    break
                candidate = ordered[(start + step) % len(ordered)]
                if candidate not in wanted:
                    wanted.append(candidate)
            partitions.append({"topic": topic.topic, "partition": partition, "replicas": wanted})
    plan_file.parent.mkdir(parents=True, exist_ok=True)
    plan_file.write_text(json.dumps({"version": 1, "partitions": partitions}, indent=1) + "\n")
    commands = [
        f"kafka-reassign-partitions.sh --bootstrap-server {bootstrap} "
        f"--reassignment-json-file {plan_file} --execute"
    ]
    commands += [
        f"kafka-configs.sh --bootstrap-server {bootstrap} --alter --entity-type topics "
        f"--entity-name {topic.topic} --add-config {MIN_INSYNC_KEY}={replication.min_insync}"
        for topic in topics
    ]
    return commands
