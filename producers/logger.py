"""The run-scoped event logger: TrainerEvents from a training loop to ``<prefix>.events``."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import get_args

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from rlpulse.producers.config import (
    ProducerConfig,
    WarnOnce,
    new_producer,
    require_int,
    require_run_id,
    string_map,
)
from rlpulse.producers.exceptions import InvalidFieldError, InvalidValueError, ProducerClosedError
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import EventKind, TrainerEvent

log = logging.getLogger(__name__)

EVENT_KINDS: tuple[str, ...] = get_args(EventKind)
_NOT_NUMBERS = (str, bytes, bytearray)


class EventLogger:
    """Publishes one run's TrainerEvents from one process (one rank) without ever blocking.

    Construction does no network I/O; the librdkafka producer starts on the first
    event. ``log()`` hands the encoded event to librdkafka's local queue, which
    batches, compresses and retries in the background; transport trouble shows up in
    the counters (``failed``, ``dropped``) and in ``logging``, never as an exception.
    ``producer_id`` (fixed per logger) and ``seq`` (0, 1, 2, ...) identify each event,
    so consumers drop the duplicates that retries can produce.
    """

    def __init__(
        self,
        run_id: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        attempt: int = 0,
        tags: Mapping[str, str] | None = None,
        config: ProducerConfig | None = None,
    ) -> None:
        self.run_id = require_run_id(run_id)
        self.rank = require_int("rank", rank, 0)
        self.world_size = require_int("world_size", world_size, 1)
        self.attempt = require_int("attempt", attempt, 0)
        self.tags = string_map("tags", tags)
        self.config = config if config is not None else ProducerConfig()
        self.producer_id = uuid.uuid4().hex
        self.hostname = socket.gethostname()
        self._topic = self.config.topics.events
        self._key = self.run_id.encode()
        self._codec = default_codec()
        self._lock = threading.RLock()
        self._producer: Producer | None = None
        self._closed = False
        self._seq = 0
        self._sent = 0
        self._delivered = 0
        self._failed = 0
        self._dropped = 0
        self._warn = WarnOnce(log)

    @property
    def sent(self) -> int:
        """Events handed to librdkafka's queue."""
        return self._sent

    @property
    def delivered(self) -> int:
        """Events the broker acknowledged."""
        return self._delivered

    @property
    def failed(self) -> int:
        """Queued events that librdkafka gave up on (delivery timeout, fatal error)."""
        return self._failed

    @property
    def dropped(self) -> int:
        """Events never queued: the local queue was full or librdkafka refused them."""
        return self._dropped

    def log(
        self,
        metrics: Mapping[str, float],
        step: int,
        stage: str = "trainer",
        *,
        kind: EventKind = "metrics",
        level: str | None = None,
        message: str | None = None,
        world_size: int | None = None,
        policy_version: int | None = None,
        trace_id: str | None = None,
    ) -> None:
        """Publish one event for ``step`` and ``stage``; returns at once.

        Metric values may be anything ``float()`` accepts except strings (ints, numpy
        scalars, one-element tensors); anything else raises :class:`InvalidFieldError`
        (a ``TypeError``) naming the key. ``world_size`` overrides the logger's for
        this event (stages run by fewer ranks).
        """
        if self._closed:
            raise ProducerClosedError(f"EventLogger for run {self.run_id!r} is closed")
        if kind not in EVENT_KINDS:
            raise InvalidValueError("kind", kind, EVENT_KINDS)
        if not isinstance(stage, str) or not stage:
            raise InvalidFieldError("stage", None, stage, "a non-empty str")
        for field, text in (("level", level), ("message", message), ("trace_id", trace_id)):
            if text is not None and not isinstance(text, str):
                raise InvalidFieldError(field, None, text, "a str or None")
        event: TrainerEvent = {
            "kind": kind,
            "run_id": self.run_id,
            "attempt": self.attempt,
            "step": require_int("step", step, -(2**63)),
            "stage": stage,
            "rank": self.rank,
            "world_size": (
                self.world_size if world_size is None else require_int("world_size", world_size, 1)
            ),
            "metrics": _metric_values(metrics),
            "level": level,
            "message": message,
            "tags": self.tags,
            "timestamp_ns": time.time_ns(),
            "hostname": self.hostname,
            "pid": os.getpid(),
            "producer_id": self.producer_id,
            "seq": 0,
            "policy_version": (
                None
                if policy_version is None
                else require_int("policy_version", policy_version, -(2**63))
            ),
            "trace_id": trace_id,
        }
        self._send(event)

    def run_start(self, step: int = 0) -> None:
        """Publish a ``run_start`` event (``step`` is where this attempt starts)."""
        self.log({}, step, kind="run_start")

    def run_end(self, step: int) -> None:
        """Publish a ``run_end`` event; the joiner closes the run's open steps."""
        self.log({}, step, kind="run_end")

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait up to ``timeout_s`` for queued events to be delivered; return how many remain."""
        with self._lock:
            producer = self._producer
        if producer is None:
            return 0
        return int(producer.flush(timeout_s))

    def close(self, timeout_s: float = 10.0) -> int:
        """Flush, then release the producer; return the events still undelivered (lost).

        Calling it again does nothing and returns 0.
        """
        with self._lock:
            if self._closed:
                return 0
            self._closed = True
        remaining = self.flush(timeout_s)
        if remaining:
            log.warning(
                "run %s: %d event(s) not delivered within %.1f s of close(); they are lost",
                self.run_id,
                remaining,
                timeout_s,
            )
        with self._lock:
            self._producer = None
        return remaining

    def __enter__(self) -> EventLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, event: TrainerEvent) -> None:
        with self._lock:
            if self._closed:  # close() ran since log() checked
                raise ProducerClosedError(f"EventLogger for run {self.run_id!r} is closed")
            event["seq"] = self._seq
            value = self._codec.encode("TrainerEvent", event)
            self._seq += 1
            if self._producer is None:
                self._producer = new_producer(self.config, f"event logger of run {self.run_id}")
            producer = self._producer
            try:
                producer.produce(self._topic, key=self._key, value=value, on_delivery=self._done)
            except BufferError:
                self._dropped += 1
                self._warn(
                    "queue-full",
                    "run %s: librdkafka's local queue is full (broker slow or unreachable); "
                    "dropping events, see EventLogger.dropped",
                    self.run_id,
                )
            except KafkaException as exc:
                self._dropped += 1
                self._warn(
                    "produce-refused",
                    "run %s: librdkafka refused an event: %s; dropping it",
                    self.run_id,
                    exc,
                )
            else:
                self._sent += 1
        producer.poll(0)

    def _done(self, error: KafkaError | None, _message: Message) -> None:
        """Count a delivery report (librdkafka calls this from ``poll``/``flush``)."""
        with self._lock:
            if error is None:
                self._delivered += 1
                return
            self._failed += 1
            self._warn(
                f"delivery-{error.name()}",
                "run %s: an event could not be delivered: %s",
                self.run_id,
                error.str(),
            )


def _metric_values(metrics: Mapping[str, float]) -> dict[str, float]:
    """Return ``metrics`` as a ``dict[str, float]``; a non-numeric value names its key."""
    if not isinstance(metrics, Mapping):
        raise InvalidFieldError("metrics", None, metrics, "a mapping of metric name to number")
    values: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise InvalidFieldError("metrics", repr(key), key, "str metric names")
        if isinstance(value, _NOT_NUMBERS):
            raise InvalidFieldError("metrics", key, value, "a number")
        try:
            values[key] = float(value)
        except (TypeError, ValueError, RuntimeError):
            raise InvalidFieldError("metrics", key, value, "a number") from None
    return values
