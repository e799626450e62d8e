"""Writing one record and waiting until the broker has it: what operator actions need."""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException, Producer

from rlpulse.ops.exceptions import PublishError
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import bootstrap_servers
from rlpulse.transport.clients import ClientDiagnostics, kafka_error_of, new_producer
from rlpulse.transport.topics import missing_topic, topic_exists

__all__ = ["publish_one"]

_FLUSH_SLICE_S = 0.25
_TOPIC_CHECK_S = 5.0


def publish_one(
    settings: Settings,
    topic: str,
    key: bytes,
    value: bytes,
    *,
    client: str,
    headers: list[tuple[str, str | bytes | None]] | None = None,
) -> None:
    """Produce one record to ``topic`` and wait until it is confirmed (:class:`PublishError`).

    The wait lasts up to ``operator.kafka_timeout_s``.

    Refused credentials or a failed TLS handshake end the wait at once, with what to check;
    a record the broker refuses (no ACL to write ``topic``) ends it with the broker's word.
    The client's own librdkafka lines stay at DEBUG: the error is one sentence with the
    cause (the broker out of reach, the topic missing).
    """
    diagnostics = ClientDiagnostics(client, settings, quiet=True)
    producer = new_producer(settings, client, {"enable.idempotence": True}, diagnostics)
    failures: list[KafkaError] = []
    timeout_s = settings.operator.kafka_timeout_s

    def delivered(error: KafkaError | None, _message: object) -> None:
        if error is not None:  # read later: in a callback after a fatal error it cannot be
            failures.append(error)

    deadline = time.monotonic() + timeout_s
    remaining = 1
    try:
        producer.produce(topic, key=key, value=value, headers=headers, on_delivery=delivered)
        while remaining and diagnostics.failure is None and time.monotonic() < deadline:
            remaining = producer.flush(min(_FLUSH_SLICE_S, max(0.0, deadline - time.monotonic())))
    except (KafkaException, SystemError) as exc:  # fatal: e.g. this user may write no topic
        error = kafka_error_of(exc)
        if error is None:
            raise
        raise PublishError(
            f"could not publish to {topic} at {bootstrap_servers(settings)}: {error.str()}"
        ) from None
    if diagnostics.failure is not None:
        raise PublishError(f"could not publish to {topic}: {diagnostics.failure}")
    if remaining or failures:
        reason = (
            f"{failures[0].str()} ({failures[0].name()})"
            if failures
            else _unconfirmed(producer, topic, diagnostics, timeout_s)
        )
        raise PublishError(
            f"could not publish to {topic} at {bootstrap_servers(settings)}: {reason}"
        )


def _unconfirmed(
    producer: Producer, topic: str, diagnostics: ClientDiagnostics, timeout_s: float
) -> str:
    """Why a record was not confirmed within ``timeout_s``: no broker, or no topic."""
    cause = diagnostics.cause()
    if cause is not None:
        return f"Kafka did not answer within {timeout_s:g} s ({cause})"
    if topic_exists(producer, topic, _TOPIC_CHECK_S) is False:
        return missing_topic(topic)
    return f"not confirmed within {timeout_s:g} s"
