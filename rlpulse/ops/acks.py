"""Waiting for a run's answer to an operator's command: its ``CommandAck``.

:class:`AckWatch` reads ``<prefix>.acks`` from the end it had when the watch opened, so it
is opened before the command is published: an ack written at once is not missed, and old
acks are never read. Trainers ack a command at the step that applied it, so the wait is
bounded by the caller; no ack within it is an answer too (no trainer of that run is
polling, or its steps are slower than the wait).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

from confluent_kafka import KafkaException, TopicPartition

from rlpulse.closing import ClosedByWith
from rlpulse.ops.exceptions import AckWaitError
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.exceptions import DecodeError
from rlpulse.schemas.records import CommandAck
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import bootstrap_servers
from rlpulse.transport.clients import ClientDiagnostics, kafka_error_of, new_consumer
from rlpulse.transport.topics import missing_topic

__all__ = ["AckWatch", "TopicWatch", "describe_ack"]

_SLICE_S = 0.25


class TopicWatch(ClosedByWith):
    """Reads one topic from the end it had when the watch opened.

    Opened before a command is published, so an answer written at once is not missed and old
    ones are never read. Opening it finds the topic's partitions and their ends
    (:class:`AckWaitError` when the topic does not exist or Kafka does not answer within
    ``operator.kafka_timeout_s``; ``without`` says what its absence means).
    """

    def __init__(self, settings: Settings, topic: str, without: str) -> None:
        timeout_s = settings.operator.kafka_timeout_s
        self._topic = topic
        self._diagnostics = ClientDiagnostics("operator", settings, quiet=True)
        self._consumer = new_consumer(
            settings, f"{settings.prefix}-operator-{uuid.uuid4().hex}", "operator",
            diagnostics=self._diagnostics,
        )  # fmt: skip
        self._codec = default_codec()
        where = f"Kafka at {bootstrap_servers(settings)}"
        try:
            metadata = self._consumer.list_topics(self._topic, timeout=timeout_s)
            found = metadata.topics.get(self._topic)
            if found is None or found.error is not None or not found.partitions:
                raise AckWaitError(f"{missing_topic(self._topic)}, {without}; nothing was sent")
            ends = []
            for partition in found.partitions:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self._topic, partition), timeout=timeout_s
                )
                ends.append(TopicPartition(self._topic, partition, high))
            self._consumer.assign(ends)
        except KafkaException as exc:
            self._consumer.poll(0)  # serves the client's error callbacks: they say why
            self.close()
            if self._diagnostics.failure is not None:  # refused credentials, TLS: no timeout
                raise AckWaitError(f"{self._diagnostics.failure}; nothing was sent") from None
            error = kafka_error_of(exc)
            reason = self._diagnostics.cause() or (error.str() if error is not None else str(exc))
            raise AckWaitError(
                f"{where} did not answer within {timeout_s:g} s ({reason}); nothing was sent"
            ) from None
        except AckWaitError:
            self.close()
            raise

    def values(self, timeout_s: float) -> Iterator[bytes]:
        """The values that arrive within ``timeout_s`` (at most a quarter second at a time)."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if self._diagnostics.failure is not None:
                raise AckWaitError(f"cannot read {self._topic}: {self._diagnostics.failure}")
            for message in self._consumer.consume(100, timeout=min(_SLICE_S, left)):
                if message.error() is None:
                    yield message.value() or b""

    def close(self) -> None:
        """Close the consumer (it never committed anything)."""
        self._consumer.close()


class AckWatch(TopicWatch):
    """Reads the acks topic from its current end for the ack of one command id."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, Topics(settings.prefix).acks, "so no trainer can ack")

    def wait(self, command_id: str, timeout_s: float) -> CommandAck | None:
        """The first ack of ``command_id`` within ``timeout_s``, or None."""
        for value in self.values(timeout_s):
            try:
                ack = self._codec.decode_ack(value)
            except DecodeError:
                continue
            if ack["command_id"] == command_id:
                return ack
        return None


def describe_ack(ack: CommandAck) -> str:
    """``applied at step 12 (key=value, ...)``: the ack's status, step and detail."""
    text: str = ack["status"]
    if ack["applied_at_step"] is not None:
        text += f" at step {ack['applied_at_step']}"
    if ack["detail"]:
        text += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(ack["detail"].items())) + ")"
    return text
