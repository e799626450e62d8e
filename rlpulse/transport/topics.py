"""Creating, checking and deleting rlpulse's topics."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection
from typing import Any, Final, NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    OffsetSpec,
)
from confluent_kafka.cimpl import NewTopic

from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.transport.clients import new_admin
from rlpulse.transport.exceptions import BrokerUnavailableError, TopicError, TransportError
from rlpulse.transport.replication import Replication, cluster_replication

__all__ = [
    "LATEST_OFFSET",
    "EnsuredTopics",
    "RaisedLimits",
    "TopicSpec",
    "create_missing",
    "delete_topics",
    "ensure_topics",
    "ensure_topics_for_reader",
    "list_topics",
    "missing_topic",
    "raise_message_limits",
    "topic_config",
    "topic_exists",
    "wanted_partitions",
]

LATEST_OFFSET: Final[Any] = OffsetSpec.latest()  # type: ignore[no-untyped-call]
"""The ``OffsetSpec`` of a partition's end, for ``AdminClient.list_offsets``."""
_PROBE_TIMEOUT_S: Final = 5.0
"""How long one ListOffsets probe of new partitions waits (then the next is sent)."""

_UNKNOWN_TOPIC = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)


class EnsuredTopics(NamedTuple):
    """What :func:`ensure_topics` did: the topics it created, and the cluster's replication."""

    created: list[str]
    """The names this call created (sorted)."""
    replication: Replication
    """The replication new topics get on this cluster (:mod:`rlpulse.transport.replication`)."""


def wanted_partitions(topics: Topics, partitions: int) -> dict[str, int]:
    """Each topic of ``topics`` and its partition count.

    The run-keyed topics share one partition count, since the worker's tables are
    co-partitioned with its inputs; the rules topic has one partition (it holds one record).
    The log records, the rollout samples and their texts, and the audits are keyed by run
    too, with as many partitions.
    """
    wanted = dict.fromkeys(topics.keyed_by_run(), partitions)
    wanted[topics.dlq] = partitions
    wanted[topics.logs] = partitions
    wanted[topics.audits] = partitions
    wanted[topics.samples] = partitions
    wanted[topics.sample_texts] = partitions
    wanted[topics.rules] = 1
    return wanted


def ensure_topics(
    settings: Settings,
    topics: Topics | None = None,
    partitions: int | None = None,
    timeout_s: float = 30.0,
) -> EnsuredTopics:
    """Create the topics of ``topics`` (default: the settings' prefix) that do not exist yet.

    ``partitions`` defaults to ``settings.worker.partitions``. An existing topic with another
    partition count is an error (:class:`TopicError`); returns, once every partition has a
    leader and those of the topics it created are served (:func:`create_missing`), what it
    created and the replication it created them with.
    """
    names = topics if topics is not None else Topics(settings.prefix)
    count = partitions if partitions is not None else settings.worker.partitions
    admin = new_admin(settings)
    replication = cluster_replication(settings, admin, timeout_s)
    wanted = {
        name: TopicSpec(want, topic_config(names, name))
        for name, want in wanted_partitions(names, count).items()
    }
    created = create_missing(admin, wanted, replication, timeout_s)
    return EnsuredTopics(created, replication)


def ensure_topics_for_reader(
    settings: Settings, timeout_s: float, refresh_s: float, say: Callable[[str], None]
) -> None:
    """For a process that reads the topics (archiver, indexer): create those not there yet.

    Says what it created; where it may not create them (a principal that may only read),
    says so and that a topic created later is read within ``refresh_s`` (the consumer's
    ``topic.metadata.refresh.interval.ms``).
    """
    prefix = settings.prefix
    try:
        created = ensure_topics(settings, timeout_s=max(1.0, min(10.0, timeout_s))).created
    except TransportError as exc:  # e.g. this principal may only read
        say(
            f"did not create the {prefix}.* topics ({exc}); a topic that does not exist yet "
            f"is read within {refresh_s:g} s of its creation (`rlpulse worker` creates them "
            "when it starts)"
        )
        return
    if created:
        say(f"created the topics no worker had created yet: {', '.join(created)}")


class TopicSpec(NamedTuple):
    """A topic to create: its partition count and its topic-level configuration."""

    partitions: int
    config: dict[str, str]


def create_missing(
    admin: AdminClient,
    wanted: dict[str, TopicSpec],
    replication: Replication,
    timeout_s: float,
) -> list[str]:
    """Create the topics of ``wanted`` that do not exist, with ``replication``'s copies.

    An existing topic with another partition count is an error (:class:`TopicError`).
    Returns the names it created (sorted) once every partition of ``wanted`` has a leader
    and every partition of a topic created just now (by this call or a concurrent one) is
    served by it (:func:`wait_until_writable`).
    """
    existing = list_topics(admin, timeout_s)
    for name, spec in wanted.items():
        if name in existing and len(existing[name].partitions) != spec.partitions:
            raise TopicError(
                f"topic {name} has {len(existing[name].partitions)} partitions, rlpulse needs "
                f"{spec.partitions}; delete it or use another prefix"
            )
    new = [
        NewTopic(
            name,
            num_partitions=spec.partitions,
            replication_factor=replication.factor,
            config={**spec.config, **replication.topic_config()},
        )
        for name, spec in wanted.items()
        if name not in existing
    ]
    created: list[str] = []
    if new:
        for name, future in admin.create_topics(new, request_timeout=timeout_s).items():
            try:
                future.result()
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise TopicError(f"could not create topic {name}: {exc}") from exc
            else:
                created.append(name)
    fresh = [topic.topic for topic in new]  # created by this call or by another one just now
    wait_until_writable(
        admin, {name: spec.partitions for name, spec in wanted.items()}, fresh, timeout_s
    )
    return sorted(created)


MAX_MESSAGE_BYTES: Final = "max.message.bytes"
_REFUSED_CHANGE: Final = (
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.POLICY_VIOLATION,
    KafkaError.INVALID_CONFIG,
)


class RaisedLimits(NamedTuple):
    """What :func:`raise_message_limits` did: topics raised, and each refusal (one line)."""

    raised: list[str]
    refused: list[str]


def raise_message_limits(
    admin: AdminClient, wanted: dict[str, TopicSpec], timeout_s: float
) -> RaisedLimits:
    """Give each existing topic of ``wanted`` at least its spec's ``max.message.bytes``.

    A topic made before a larger limit was wanted keeps the broker's default (1 MiB) until
    this raises it; a limit already larger is left alone. A change the cluster refuses (no
    permission, a policy) is reported, not raised; other Kafka errors raise.
    """
    limits = {
        name: int(spec.config[MAX_MESSAGE_BYTES])
        for name, spec in wanted.items()
        if MAX_MESSAGE_BYTES in spec.config
    }
    done = RaisedLimits([], [])
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in limits]
    described = admin.describe_configs(resources, request_timeout=timeout_s) if resources else {}
    for resource, future in described.items():
        name = resource.name
        try:
            entry = future.result().get(MAX_MESSAGE_BYTES)
            if entry is not None and int(entry.value) >= limits[name]:
                continue
            change = ConfigResource(
                ConfigResource.Type.TOPIC,
                name,
                incremental_configs=[
                    ConfigEntry(
                        MAX_MESSAGE_BYTES,
                        str(limits[name]),
                        incremental_operation=AlterConfigOpType.SET,
                    )
                ],
            )
            for altered in admin.incremental_alter_configs(
                [change], request_timeout=timeout_s
            ).values():
                altered.result()
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is None or error.code() not in _REFUSED_CHANGE:
                raise
            done.refused.append(f"{name}: {error.str()}")
        else:
            done.raised.append(name)
    done.raised.sort()
    return done


def topic_config(topics: Topics, name: str) -> dict[str, str]:
    """The topic-level configuration rlpulse creates topic ``name`` with."""
    if name == topics.rules:
        return {"cleanup.policy": "compact"}
    if name in topics.stamped_by_broker():
        return {"message.timestamp.type": "LogAppendTime"}
    return {}


def wait_until_writable(
    admin: AdminClient, wanted: dict[str, int], new: Collection[str], timeout_s: float
) -> None:
    """Block until every partition of ``wanted`` has a leader, one that serves it if ``new``.

    The metadata names a new partition's leader before that broker has created it: for up
    to seconds on a busy broker, requests to it fail with NOT_LEADER_OR_FOLLOWER. An
    idempotent producer writing then can lose its first records with no error reported
    (the broker accepts a later request of it first and refuses the earlier one's retries:
    KAFKA-15591, fixed in Kafka 4.5). So a topic of ``new`` counts as ready only once its
    every partition's leader answers a ListOffsets request. Topics that existed before are
    not probed: a dead leader that the cluster has not replaced yet must not hold up a
    worker's restart.
    """
    deadline = time.monotonic() + timeout_s
    unanswered: list[TopicPartition] = []
    while True:
        metadata = list_topics(admin, max(1.0, deadline - time.monotonic()))
        if all(
            name in metadata
            and metadata[name].error is None
            and len(metadata[name].partitions) == want
            and all(p.leader >= 0 and p.error is None for p in metadata[name].partitions.values())
            for name, want in wanted.items()
        ):
            probed = {name: count for name, count in wanted.items() if name in new}
            unanswered = _unanswered_partitions(admin, probed, deadline) if probed else []
            if not unanswered:
                return
        if time.monotonic() >= deadline:
            waiting = (
                f"{len(unanswered)} partition(s) not yet served by their leader, e.g. "
                f"{unanswered[0].topic} [{unanswered[0].partition}]"
                if unanswered
                else "no leader for every partition"
            )
            raise BrokerUnavailableError(
                f"topics {sorted(wanted)}: {waiting} after {timeout_s:.0f} s"
            )
        time.sleep(0.1)


def _unanswered_partitions(
    admin: AdminClient, wanted: dict[str, int], deadline: float
) -> list[TopicPartition]:
    """The partitions of ``wanted`` whose leader did not answer a ListOffsets request."""
    requests = {
        TopicPartition(name, partition): LATEST_OFFSET
        for name, count in wanted.items()
        for partition in range(count)
    }
    timeout_s = max(1.0, min(_PROBE_TIMEOUT_S, deadline - time.monotonic()))
    futures = admin.list_offsets(requests, request_timeout=timeout_s)
    unanswered = []
    for tp, future in futures.items():
        try:
            future.result()
        except KafkaException:
            unanswered.append(tp)
    return sorted(unanswered, key=lambda tp: (tp.topic, tp.partition))


def delete_topics(settings: Settings, names: list[str], timeout_s: float = 10.0) -> None:
    """Delete the topics of ``names`` that exist; best effort (a leftover topic is harmless)."""
    admin = new_admin(settings)
    existing = list_topics(admin, timeout_s)
    doomed = [name for name in names if name in existing]
    if not doomed:
        return
    for future in admin.delete_topics(doomed, request_timeout=timeout_s).values():
        with contextlib.suppress(KafkaException):
            future.result()


def list_topics(admin: AdminClient, timeout_s: float) -> dict[str, Any]:
    """The cluster's topics by name (confluent-kafka's ``TopicMetadata``)."""
    try:
        topics: dict[str, Any] = admin.list_topics(timeout=timeout_s).topics
    except KafkaException as exc:
        raise BrokerUnavailableError(f"Kafka did not answer a metadata request: {exc}") from exc
    return topics


def topic_exists(client: Producer | Consumer, topic: str, timeout_s: float) -> bool | None:
    """Whether the broker has ``topic``; None when it did not answer within ``timeout_s``.

    Kafka as rlpulse runs it never creates a topic on first use, so asking does not create it.
    """
    try:
        metadata = client.list_topics(topic, timeout=timeout_s)
    except KafkaException:
        return None
    found = metadata.topics.get(topic)
    if found is None:
        return False
    if found.error is not None:
        return False if found.error.code() in _UNKNOWN_TOPIC else None
    return bool(found.partitions)


def missing_topic(topic: str) -> str:
    """The sentence for a topic that does not exist, saying who creates it."""
    return (
        f"topic {topic} does not exist (Kafka does not create topics on first use; "
        "`rlpulse worker` creates its prefix's topics when it starts)"
    )
