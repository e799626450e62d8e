"""Every Kafka client rlpulse uses is built here, from :class:`~rlpulse.settings.Settings`.

confluent-kafka clients (trainer producer and control client, operator commands, rules
publishing, the exporter's and archiver's consumers, admin calls) get their properties from
:func:`client_properties` plus what their role needs; the worker's faust app (aiokafka)
gets its connection options from :func:`faust_broker_options`. Each confluent client's
librdkafka log lines and errors go to ``logging`` once per kind of trouble (a broker that
is down makes librdkafka repeat itself every few hundred milliseconds). Creating a client
starts librdkafka's threads, so callers create them lazily; none of these functions does
network I/O itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from rlpulse.oncelog import WarnOnce
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import bootstrap_servers
from rlpulse.transport.exceptions import ClientConfigError

__all__ = [
    "QUEUE_MAX_MESSAGES",
    "client_hooks",
    "client_properties",
    "faust_broker_options",
    "new_admin",
    "new_consumer",
    "new_producer",
    "trainer_producer",
]

QUEUE_MAX_MESSAGES = 1_000_000
_LOG = logging.getLogger("rlpulse.librdkafka")


class _ClientDiagnostics:
    """Routes one client's librdkafka logs and errors to ``logging`` without flooding it.

    Each error code is logged once at WARNING (fatal ones at ERROR), repeats and log
    lines at DEBUG.
    """

    def __init__(self, client: str) -> None:
        self._client = client
        self._warn = WarnOnce(_LOG)

    def log(self, level: int, fmt: str, *args: object) -> None:
        """Receive a librdkafka log line (the ``logger`` property calls this)."""
        _LOG.log(level if level >= logging.CRITICAL else logging.DEBUG, fmt, *args)

    def error_cb(self, error: KafkaError) -> None:
        """Receive a librdkafka client error (the ``error_cb`` property calls this)."""
        fmt = "%s: Kafka error %s: %s"
        if error.fatal():
            _LOG.error(fmt, self._client, error.name(), error.str())
        else:
            self._warn(str(error.code()), fmt, self._client, error.name(), error.str())


def client_hooks(client: str) -> dict[str, Any]:
    """The ``logger`` and ``error_cb`` properties for one client named ``client``."""
    diagnostics = _ClientDiagnostics(client)
    return {"logger": diagnostics, "error_cb": diagnostics.error_cb}


def client_properties(settings: Settings) -> dict[str, Any]:
    """The librdkafka properties every client shares: where Kafka is, and how to reach it."""
    return {"bootstrap.servers": bootstrap_servers(settings)}


def _build(kind: type[Any], properties: Mapping[str, Any], client: str) -> Any:
    try:
        return kind({**properties, **client_hooks(client)})
    except (KafkaException, ValueError, TypeError) as exc:
        raise ClientConfigError(f"{client}: librdkafka refused the settings: {exc}") from exc


def new_producer(
    settings: Settings, client: str, overrides: Mapping[str, Any] | None = None
) -> Producer:
    """A confluent ``Producer`` (``acks=all``); ``settings.librdkafka`` is merged last."""
    properties = {
        **client_properties(settings),
        "acks": "all",
        **(overrides or {}),
        **settings.librdkafka,
    }
    producer: Producer = _build(Producer, properties, client)
    return producer


def trainer_producer(settings: Settings, client: str) -> Producer:
    """The trainer's idempotent, batched, compressed event producer.

    ``murmur2_random`` is the Java client's partitioner (and faust's), so a run id lands on
    the same partition whichever client wrote it.
    """
    producer_settings = settings.producer
    return new_producer(
        settings,
        client,
        {
            "enable.idempotence": True,
            "linger.ms": producer_settings.linger_ms,
            "compression.type": producer_settings.compression,
            "partitioner": "murmur2_random",
            "queue.buffering.max.messages": QUEUE_MAX_MESSAGES,
            "message.timeout.ms": max(1, round(producer_settings.delivery_timeout_s * 1000)),
        },
    )


def new_consumer(
    settings: Settings, group_id: str, client: str, overrides: Mapping[str, Any] | None = None
) -> Consumer:
    """A confluent ``Consumer`` that never commits unless ``overrides`` say so."""
    properties = {
        **client_properties(settings),
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        **(overrides or {}),
        **settings.librdkafka,
    }
    consumer: Consumer = _build(Consumer, properties, client)
    return consumer


def new_admin(settings: Settings, client: str = "admin") -> AdminClient:
    """A confluent ``AdminClient``."""
    admin: AdminClient = _build(
        AdminClient, {**client_properties(settings), **settings.librdkafka}, client
    )
    return admin


def faust_broker_options(settings: Settings) -> dict[str, Any]:
    """The connection options of the worker's ``faust.App`` (aiokafka underneath)."""
    return {"broker": f"kafka://{bootstrap_servers(settings)}"}
