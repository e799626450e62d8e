"""The trainer's side of the control loop: read this run's commands, acknowledge them.

Before a command reaches the training loop the client checks it: with a signing key
configured (``security.control_signing_key``), that it carries a valid signature and is
not older than the lookback (:mod:`rlpulse.schemas.signing`); always, that its contents are
sound (:mod:`rlpulse.producers.control.screening`). A command that fails is acked ``rejected`` with
the reason and never returned.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import get_args

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from rlpulse.closing import ClosedByWith
from rlpulse.diagnostics import WarnOnce
from rlpulse.producers.control.screening import command_problem
from rlpulse.producers.encoding.arguments import (
    LONG_MAX,
    LONG_MIN,
    require_int,
    require_run_id,
    string_map,
)
from rlpulse.producers.exceptions import InvalidValueError, ProducerClosedError
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.exceptions import DecodeError
from rlpulse.schemas.records import AckStatus, CommandAck, ControlCommand
from rlpulse.schemas.signing import signature_problem
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.transport.backoff import Backoff
from rlpulse.transport.clients import kafka_error_of, new_consumer, new_producer
from rlpulse.transport.partitioning import partition_for
from rlpulse.transport.roles import control_group_prefix

log = logging.getLogger(__name__)

ACK_STATUSES: tuple[str, ...] = get_args(AckStatus)
SIGNATURE_CHECK = "signature"
"""``detail["check"]`` of a command refused for its signature. Its id is not remembered as
handled (the id of a forged command is the forger's choice)."""
CONTENTS_CHECK = "contents"
"""``detail["check"]`` of a command refused for its contents."""
_BATCH = 500
_MAX_BATCHES_PER_POLL = 20
_FIRST_RETRY_S = 0.5
_MAX_RETRY_S = 30.0
_STARTER_JOIN_S = 1.0


class ControlClient(ClosedByWith):
    """Reads the control topic for one run attempt and writes its acks.

    Construction does no network I/O. The first :meth:`poll` starts a daemon thread
    that starts the client: it finds the run's partition of the control and acks topics
    (records keyed by run are partitioned with murmur2 by every client, so the client reads
    that partition alone: start-up work grows with its own run, not with the cluster's),
    rebuilds the set of command ids already acknowledged for this run (acks of the
    last ``producer.control_lookback_s`` seconds, read up to the end the acks topic had
    at start), then positions the consumer at the commands of the same lookback.
    Each attempt spends at most ``startup_timeout_s``; failed attempts (broker down,
    topics missing) are retried with a growing pause (0.5 s up to 30 s). Until
    start-up has completed, ``poll()`` returns nothing — after waiting at most its
    ``timeout_s``, so a missing broker never stalls the training loop — and a
    restarted trainer never gets a command that was acked.

    With a signing key in ``settings.security``, a command that is unsigned, wrongly signed
    or issued before the lookback is acked ``rejected`` and not returned; so is any command
    whose contents fail :func:`~rlpulse.producers.control.screening.command_problem`. Construction
    reads the key (a :class:`~rlpulse.exceptions.SettingsError` if its file is unusable).

    Not thread-safe: call it from the training loop's thread (in SPMD jobs, rank 0).
    """

    def __init__(
        self,
        run_id: str,
        *,
        attempt: int = 0,
        settings: Settings | None = None,
        startup_timeout_s: float = 10.0,
        ack_timeout_s: float = 10.0,
    ) -> None:
        self.run_id = require_run_id(run_id)
        self.attempt = require_int("attempt", attempt, 0)
        self.settings = settings if settings is not None else Settings()
        self.startup_timeout_s = startup_timeout_s
        self.ack_timeout_s = ack_timeout_s
        self.dry_run_seen: list[ControlCommand] = []
        """Dry-run commands for this run attempt, in arrival order (never returned by poll)."""
        self.start_up_acks_read = 0
        """Ack records (of any run) read at start-up to rebuild the acknowledged command ids."""
        topics = Topics(self.settings.prefix)
        self._control_topic = topics.control
        self._acks_topic = topics.acks
        self._key = self.run_id.encode()
        self._codec = default_codec()
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._closed = False
        self._started = False
        self._plan: _StartPlan | None = None
        self._starter: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._returned: set[str] = set()
        self._acked: set[str] = set()
        self._dry_run_ids: set[str] = set()
        self._warn = WarnOnce(log)
        self._signing_key = self.settings.security.signing_key()

    @property
    def started(self) -> bool:
        """Whether start-up (topic discovery and the acks rebuild) has completed."""
        return self._started

    @property
    def acked_command_ids(self) -> frozenset[str]:
        """Command ids acknowledged for this run: found at start-up or acked by this client."""
        return frozenset(self._acked)

    def poll(self, timeout_s: float = 0.0) -> list[ControlCommand]:
        """Return the new commands for this run attempt, oldest first.

        Waits at most ``timeout_s`` for the first one (default: take what has
        arrived). Commands of other runs or attempts, duplicates (already returned
        or already acked) and dry-run commands (added to :attr:`dry_run_seen`) are
        left out; undecodable messages are logged with the reason and skipped.
        """
        if self._closed:
            raise ProducerClosedError(f"ControlClient for run {self.run_id!r} is closed")
        deadline = time.monotonic() + max(timeout_s, 0.0)
        if not self._started and not self._wait_started(timeout_s):
            return []
        return self._read_commands(deadline)

    def ack(
        self,
        command: ControlCommand,
        status: AckStatus,
        *,
        applied_at_step: int | None = None,
        detail: Mapping[str, str] | None = None,
    ) -> bool:
        """Write a CommandAck for ``command`` and wait up to ``ack_timeout_s`` for it.

        Call it after the action was applied (or refused, or failed). Returns whether
        the broker confirmed the ack; an unconfirmed ack stays queued until
        :meth:`close` and is logged, never raised, since the action already happened.
        """
        if self._closed:
            raise ProducerClosedError(f"ControlClient for run {self.run_id!r} is closed")
        if status not in ACK_STATUSES:
            raise InvalidValueError("status", status, ACK_STATUSES)
        if command["run_id"] != self.run_id:
            raise InvalidValueError(
                "command['run_id']", command["run_id"], f"{self.run_id!r} (this client's run)"
            )
        record: CommandAck = {
            "command_id": command["command_id"],
            "run_id": self.run_id,
            "attempt": command["attempt"],
            "status": status,
            "applied_at_step": (
                None
                if applied_at_step is None
                else require_int("applied_at_step", applied_at_step, LONG_MIN, LONG_MAX)
            ),
            "detail": string_map("detail", detail),
            "acked_ns": time.time_ns(),
        }
        self._acked.add(record["command_id"])
        reports = self._send_ack(record)
        if reports is None:
            return False
        self._serve_acks(self.ack_timeout_s)
        if not reports:
            log.warning(
                "run %s: ack of %s not confirmed within %.1f s; still queued until close()",
                self.run_id,
                record["command_id"],
                self.ack_timeout_s,
            )
            return False
        if reports[0] is not None:
            log.warning(
                "run %s: ack of %s failed: %s", self.run_id, record["command_id"], reports[0].str()
            )
            return False
        return True

    def _send_ack(self, record: CommandAck) -> list[KafkaError | None] | None:
        """Queue ``record``; the list receives its delivery report. None if it was not queued."""
        value = self._codec.encode("CommandAck", record)
        if self._producer is None:
            self._producer = new_producer(
                self.settings, f"control client of run {self.run_id}", {"enable.idempotence": True}
            )
        reports: list[KafkaError | None] = []
        try:
            self._producer.produce(
                self._acks_topic,
                key=self._key,
                value=value,
                on_delivery=lambda error, _msg: reports.append(error),
            )
        except (BufferError, KafkaException) as exc:
            log.warning("run %s: ack of %s not queued: %s", self.run_id, record["command_id"], exc)
            return None
        return reports

    def _reject(self, command: ControlCommand, reason: str, check: str) -> None:
        """Ack ``command`` ``rejected`` without waiting (``close()`` flushes); log why."""
        log.warning(
            "run %s: refused command %s (%s, %s): %s",
            self.run_id,
            command["command_id"],
            command["origin"],
            command["rule_id"] or "no rule",
            reason,
        )
        if check != SIGNATURE_CHECK:
            self._acked.add(command["command_id"])
        record: CommandAck = {
            "command_id": command["command_id"],
            "run_id": self.run_id,
            "attempt": command["attempt"],
            "status": "rejected",
            "applied_at_step": None,
            "detail": {"reason": reason, "check": check},
            "acked_ns": time.time_ns(),
        }
        if self._send_ack(record) is not None:
            self._serve_acks(0.0)

    def _serve_acks(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for the queued acks; return how many are still queued.

        A fatal producer error (a user without the ACL to write acks) is logged, not raised.
        """
        if self._producer is None:
            return 0
        try:
            if timeout_s <= 0:
                self._producer.poll(0)
                return len(self._producer)
            return int(self._producer.flush(timeout_s))
        except (KafkaException, SystemError) as exc:
            error = kafka_error_of(exc)
            if error is None:
                raise
            self._warn("ack-fatal", "run %s: acks cannot be written: %s", self.run_id, error.str())
            return len(self._producer)

    def close(self) -> None:
        """Stop reading and give queued acks up to ``ack_timeout_s`` to be delivered."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        if self._producer is not None:
            remaining = self._serve_acks(self.ack_timeout_s)
            if remaining:
                log.warning("run %s: %d ack(s) lost at close()", self.run_id, remaining)
            self._producer = None
        starter = self._starter
        if starter is not None:
            starter.join(_STARTER_JOIN_S)
            if starter.is_alive():  # still in a metadata call: it closes the consumer itself
                return
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # -- start-up ---------------------------------------------------------------------

    def _wait_started(self, timeout_s: float) -> bool:
        """Start the start-up thread once; wait up to ``timeout_s`` for it to finish."""
        if self._starter is None:
            self._starter = threading.Thread(
                target=self._start_in_background,
                name=f"rlpulse-control-{self.run_id}",
                daemon=True,
            )
            self._starter.start()
        if not self._ready.wait(max(timeout_s, 0.0)):
            return False
        self._started = True
        return True

    def _start_in_background(self) -> None:
        """Retry :meth:`_start` with a growing pause until it succeeds or ``close()`` is called."""
        pauses = Backoff(_FIRST_RETRY_S, _MAX_RETRY_S)
        while not self._stopping.is_set():
            try:
                if self._start(time.monotonic() + self.startup_timeout_s):
                    self._ready.set()
                    return
            except KafkaException as exc:
                self._warn(
                    "startup",
                    "run %s: control client cannot start yet: %s; retrying",
                    self.run_id,
                    exc,
                )
            self._stopping.wait(pauses.next())
        if self._consumer is not None:  # closed before start-up finished: this thread owns it
            self._consumer.close()
            self._consumer = None

    def _start(self, deadline: float) -> bool:
        """Advance start-up until ``deadline``; return whether commands can be read now."""
        if self._consumer is None:
            self._consumer = new_consumer(
                self.settings,
                control_group_prefix(self.settings.prefix) + uuid.uuid4().hex,
                f"control client of run {self.run_id}",
                {"enable.partition.eof": True},
            )
        consumer = self._consumer
        if self._plan is None:
            self._plan = self._make_plan(consumer, deadline)
            if self._plan is None:
                return False
            consumer.assign(
                [
                    TopicPartition(self._acks_topic, p, start)
                    for p, (start, _end) in self._plan.acks.items()
                ]
            )
        if not self._read_acks(consumer, self._plan.acks, deadline):
            return False
        consumer.assign(
            [TopicPartition(self._control_topic, p, o) for p, o in self._plan.control.items()]
        )
        log.info(
            "run %s attempt %d: reading commands from %s; %d command(s) already acked",
            self.run_id,
            self.attempt,
            self._control_topic,
            len(self._acked),
        )
        return True

    def _make_plan(self, consumer: Consumer, deadline: float) -> _StartPlan | None:
        """Find where to read commands and acks from; None while the control topic is missing."""
        control = _partitions(consumer, self._control_topic, deadline)
        if control is None:
            self._warn(
                "no-control-topic",
                "run %s: topic %s does not exist yet; retrying",
                self.run_id,
                self._control_topic,
            )
            return None
        cutoff_ms = int((time.time() - self.settings.producer.control_lookback_s) * 1000)
        control = [partition_for(self._key, len(control))]
        acks = _partitions(consumer, self._acks_topic, deadline) or []
        acks = [partition_for(self._key, len(acks))] if acks else []
        ack_ranges = _start_offsets(consumer, self._acks_topic, acks, cutoff_ms, deadline)
        control_ranges = _start_offsets(consumer, self._control_topic, control, cutoff_ms, deadline)
        return _StartPlan(
            control={p: start for p, (start, _end) in control_ranges.items()},
            acks={p: (start, end) for p, (start, end) in ack_ranges.items() if start < end},
        )

    def _read_acks(
        self, consumer: Consumer, to_read: dict[int, tuple[int, int]], deadline: float
    ) -> bool:
        """Read acks until every partition of ``to_read`` reached its end (then it is removed).

        Return whether all did before ``deadline``.
        """
        while to_read and time.monotonic() < deadline:
            for msg in consumer.consume(_BATCH, timeout=min(0.2, _left(deadline))):
                partition, offset = _position(msg)
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        to_read.pop(partition, None)
                    else:
                        self._warn("acks-read", "%s: %s", self._acks_topic, error.str())
                    continue
                self.start_up_acks_read += 1
                if msg.key() == self._key:
                    self._note_ack(msg)
                if partition in to_read and offset + 1 >= to_read[partition][1]:
                    del to_read[partition]
        if to_read:
            self._warn(
                "acks-slow",
                "run %s: acks topic %s not read to its end within %.1f s; commands wait for it",
                self.run_id,
                self._acks_topic,
                self.startup_timeout_s,
            )
            return False
        return True

    def _note_ack(self, msg: Message) -> None:
        try:
            ack = self._codec.decode_ack(msg.value() or b"")
        except DecodeError as exc:
            log.warning("%s: skipping undecodable ack: %s", _where(msg), exc)
            return
        forged = ack["status"] == "rejected" and ack["detail"].get("check") == SIGNATURE_CHECK
        if ack["run_id"] == self.run_id and not forged:
            self._acked.add(ack["command_id"])

    # -- commands ---------------------------------------------------------------------

    def _read_commands(self, deadline: float) -> list[ControlCommand]:
        """Consume what has arrived, waiting until ``deadline`` while nothing has."""
        if self._consumer is None:
            return []
        commands: list[ControlCommand] = []
        for _ in range(_MAX_BATCHES_PER_POLL):
            wait = 0.0 if commands else _left(deadline)
            batch = self._consumer.consume(_BATCH, timeout=wait)
            if not batch:
                break
            for msg in batch:
                command = self._accept(msg)
                if command is not None:
                    commands.append(command)
        return commands

    def _accept(self, msg: Message) -> ControlCommand | None:
        """Return the command in ``msg`` if it is new and meant for this run attempt."""
        error = msg.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                self._warn("control-read", "%s: %s", self._control_topic, error.str())
            return None
        if msg.topic() != self._control_topic or msg.key() != self._key:
            return None
        try:
            command = self._codec.decode_command(msg.value() or b"")
        except DecodeError as exc:
            log.warning(
                "%s: skipping undecodable command for run %s: %s", _where(msg), self.run_id, exc
            )
            return None
        command_id = command["command_id"]
        if command["run_id"] != self.run_id:
            log.warning(
                "%s: skipping command %s keyed %r but addressed to run %r",
                _where(msg),
                command_id,
                self.run_id,
                command["run_id"],
            )
            return None
        if command["attempt"] != self.attempt:
            log.debug("skipping command %s for attempt %d", command_id, command["attempt"])
            return None
        if command_id in self._returned or command_id in self._acked:
            log.debug("skipping duplicate command %s", command_id)
            return None
        refusal = self._signature_refusal(command)
        if refusal is not None:
            self._reject(command, refusal, SIGNATURE_CHECK)
            return None
        if command["dry_run"]:
            if command_id not in self._dry_run_ids:
                self._dry_run_ids.add(command_id)
                self.dry_run_seen.append(command)
                log.info(
                    "run %s: dry-run command %s not applied: %s",
                    self.run_id,
                    command_id,
                    command["reason"],
                )
            return None
        problem = command_problem(command, self.settings.commands)
        if problem is not None:
            self._reject(command, f"refused: {problem}", CONTENTS_CHECK)
            return None
        self._returned.add(command_id)
        return command

    def _signature_refusal(self, command: ControlCommand) -> str | None:
        """Why a signing trainer refuses ``command``; None without a key or when it is sound."""
        if self._signing_key is None:
            return None
        problem = signature_problem(command, self._signing_key, self._codec)
        if problem is not None:
            return f"refused: {problem}"
        lookback_s = self.settings.producer.control_lookback_s
        age_s = (time.time_ns() - command["issued_ns"]) / 1e9
        if age_s > lookback_s:
            return (
                f"refused: it was issued {age_s:.0f} s ago, before the lookback "
                f"(producer.control_lookback_s = {lookback_s:.0f}); a replay?"
            )
        return None


@dataclass
class _StartPlan:
    """Where a ControlClient starts: command offsets, and the acks still to read."""

    control: dict[int, int]
    """Partition -> first offset to read on the control topic."""
    acks: dict[int, tuple[int, int]]
    """Partition -> (first offset, end offset at start) on the acks topic, until read."""


def _partitions(consumer: Consumer, topic: str, deadline: float) -> list[int] | None:
    """Return the partition ids of ``topic``, or None if it does not exist."""
    metadata = consumer.list_topics(topic=topic, timeout=_left(deadline))
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        return None
    return sorted(int(p) for p in found.partitions)


def _start_offsets(
    consumer: Consumer, topic: str, partitions: list[int], cutoff_ms: int, deadline: float
) -> dict[int, tuple[int, int]]:
    """Return, per partition, the first offset at or after ``cutoff_ms`` and the end offset.

    The end is read before the time lookup, so when no message is that recent the
    start is that end: nothing older than the lookback is read, nothing newer missed.
    A partition whose lookup fails starts at its beginning.
    """
    if not partitions:
        return {}
    bounds: dict[int, tuple[int, int]] = {}
    for p in partitions:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, p), timeout=_left(deadline), cached=False
        )
        bounds[p] = (int(low), int(high))
    found = consumer.offsets_for_times(
        [TopicPartition(topic, p, cutoff_ms) for p in partitions], timeout=_left(deadline)
    )
    ranges: dict[int, tuple[int, int]] = {}
    for tp in found:
        low, high = bounds[tp.partition]
        if tp.error is not None:
            start = low
        elif tp.offset < 0:
            start = high
        else:
            start = max(tp.offset, low)
        ranges[tp.partition] = (start, high)
    return ranges


def _position(msg: Message) -> tuple[int, int]:
    """Return (partition, offset) of a consumed message, -1 for what it lacks."""
    partition, offset = msg.partition(), msg.offset()
    return (-1 if partition is None else partition, -1 if offset is None else offset)


def _left(deadline: float) -> float:
    """Seconds until ``deadline``, never negative."""
    return max(0.0, deadline - time.monotonic())


def _where(msg: Message) -> str:
    """Return ``topic[partition]@offset`` of a consumed message."""
    return f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
