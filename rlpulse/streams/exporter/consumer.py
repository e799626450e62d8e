"""The exporter's Kafka reader: every partition of its topics, from a lookback, decoded.

The exporter is not a member of a consumer group that shares partitions: each exporter needs
every record to hold every run's latest values. It assigns itself all partitions of
``<prefix>.events``, ``.steps``, ``.control``, ``.acks``, ``.verdicts``, ``.dlq`` and
``.logs`` (of which it reads only whose records they are and their levels) and starts each
at the first record written in the last ``lookback_s`` (``offsets_for_times``), not at a committed
offset. Records before each partition's end at start are the lookback (``live`` False); the
rest are live. It still commits its positions under its own group id, so the lag of the
exporter shows with the worker's (``rlpulse_consumer_lag_messages``) and in Kafka's tools.

A broker outage is librdkafka's to ride out: ``poll`` returns nothing while it lasts, and the
consumer continues from its positions when the broker is back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any, Final, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka._types import HeadersType

from rlpulse.diagnostics import WarnOnce
from rlpulse.schemas.codec import Codec, default_codec
from rlpulse.schemas.exceptions import DecodeError, DecodeFailure
from rlpulse.schemas.records import (
    ActionVerdict,
    CommandAck,
    ControlCommand,
    StepSummary,
    TrainerEvent,
)
from rlpulse.schemas.topics import REASON_HEADER, Topics
from rlpulse.settings import Settings
from rlpulse.streams.exporter.state import LogTally
from rlpulse.transport.clients import new_consumer
from rlpulse.transport.exceptions import TransportError
from rlpulse.transport.readiness import Deadline

__all__ = ["ROLES", "Incoming", "Role", "TopicReader"]

log = logging.getLogger(__name__)

Role = Literal["events", "steps", "control", "acks", "verdicts", "dlq", "logs"]
ROLES: Final[tuple[Role, ...]] = ("events", "steps", "control", "acks", "verdicts", "dlq", "logs")
Record = TrainerEvent | StepSummary | ControlCommand | CommandAck | ActionVerdict | LogTally | str
"""A decoded record; for the dead-letter topic, the message's reason header; for the logs
topic, a :class:`LogTally`."""


Incoming = tuple[Role, Record | None, bool]
"""One message read: its topic's role, its record (None: undecodable), whether it is live.

Live: written after the exporter started, not part of the lookback. A plain tuple: one is
made per message.
"""


class TopicReader:
    """Reads the exporter's topics (see the module docstring); create, :meth:`assign`, poll."""

    def __init__(self, settings: Settings, codec: Codec | None = None) -> None:
        self.settings = settings
        self.codec = codec or default_codec()
        topics = Topics(settings.prefix)
        self.roles: dict[str, Role] = {getattr(topics, role): role for role in ROLES}
        self._decoders: dict[Role, Any] = {
            "events": self.codec.decode_event,
            "steps": self.codec.decode_summary,
            "control": self.codec.decode_command,
            "acks": self.codec.decode_ack,
            "verdicts": self.codec.decode_verdict,
            "logs": self._log_tally,
        }
        self._consumer: Consumer | None = None
        self._warn = WarnOnce(log)
        self._live_from: dict[tuple[str, int], int] = {}
        self._behind: list[TopicPartition] = []

    def _log_tally(self, data: bytes) -> LogTally:
        """Whose records a logs message holds and their levels (a LogBatch, or a LogRecord)."""
        record = self.codec.decode(data)
        entries = record.get("entries")
        try:
            levels = (
                [entry["level"] for entry in entries] if entries is not None else [record["level"]]
            )
            return LogTally(record["run_id"], record["hostname"], levels)
        except (KeyError, TypeError) as exc:
            raise DecodeError(DecodeFailure.WRONG_RECORD, f"not a log record: {exc}") from exc

    def assign(self, deadline: Deadline) -> int:
        """Take every partition from its lookback offset; returns the records in the lookback.

        Raises :class:`TransportError` when Kafka does not answer in time (the caller retries).
        """
        consumer = self._consumer or new_consumer(
            self.settings,
            self.settings.exporter_group,
            "exporter",
            {
                "enable.auto.commit": True,
                "enable.auto.offset.store": True,
                "auto.commit.interval.ms": 1000,
                "fetch.wait.max.ms": 100,
            },
        )
        self._consumer = consumer
        timeout = max(1.0, min(10.0, deadline.left()))
        since_ms = int((time.time() - self.settings.exporter.lookback_s) * 1000)
        try:
            metadata = consumer.list_topics(timeout=timeout)
            wanted = [
                TopicPartition(topic, partition, since_ms)
                for topic in self.roles
                if topic in metadata.topics
                for partition in sorted(metadata.topics[topic].partitions)
            ]
            missing = sorted(set(self.roles) - set(metadata.topics))
            if missing:
                raise TransportError(f"topics {missing} do not exist yet")
            starts = consumer.offsets_for_times(wanted, timeout=timeout)
            assignment = []
            backlog = 0
            for start in starts:
                _low, end = consumer.get_watermark_offsets(start, timeout=timeout, cached=False)
                first = start.offset if start.offset >= 0 else end
                self._live_from[(start.topic, start.partition)] = end
                backlog += end - first
                assignment.append(TopicPartition(start.topic, start.partition, first))
        except KafkaException as exc:
            raise TransportError(f"no answer about the exporter's topics: {exc}") from exc
        consumer.assign(assignment)
        self._behind = [
            tp for tp in assignment if tp.offset < self._live_from[tp.topic, tp.partition]
        ]
        return backlog

    def poll(self, max_messages: int = 1000, timeout_s: float = 0.2) -> Iterator[Incoming]:
        """The messages that arrive within ``timeout_s`` (at most ``max_messages``).

        They are fetched now and each is decoded as it is taken from the iterator, so a caller
        that applies one record before taking the next holds one decoded record at a time.
        (Holding a batch of decoded records made Python's garbage collector a third of the
        exporter's time.)
        """
        assert self._consumer is not None, "assign() first"
        return self._decoded(self._consumer.consume(max_messages, timeout_s))

    def _decoded(self, messages: list[Message]) -> Iterator[Incoming]:
        live_from, roles, decoders = self._live_from, self.roles, self._decoders
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    self._warn(
                        str(error.code()), "exporter: Kafka error %s: %s", error.name(), error.str()
                    )
                continue
            topic = message.topic() or ""
            role = roles[topic]
            live = (message.offset() or 0) >= live_from[(topic, message.partition() or 0)]
            record: Record | None
            if role == "dlq":
                record = _reason(message.headers())
            else:
                try:
                    record = decoders[role](message.value() or b"")
                except DecodeError:
                    record = None
            yield role, record, live

    def caught_up(self) -> bool:
        """Whether every partition has been read up to where it ended at start."""
        if self._behind and self._consumer is not None:
            positions = self._consumer.position(self._behind)
            self._behind = [
                tp
                for tp in positions
                if tp.offset < 0 or tp.offset < self._live_from[(tp.topic, tp.partition)]
            ]
        return not self._behind

    def close(self) -> None:
        """Commit the positions and leave."""
        if self._consumer is not None:
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError) as exc:
                log.debug("exporter consumer close: %s", exc)
            self._consumer = None


def _reason(headers: HeadersType | None) -> str:
    pairs = headers.items() if isinstance(headers, dict) else headers or ()
    for name, value in pairs:
        if name == REASON_HEADER and value is not None:
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return ""
