"""The run-scoped event logger: TrainerEvents to ``<prefix>.events``, log records to ``.logs``.

Both kinds share one write-ahead log, one sender thread and one ``seq`` counter, so the
archive's audit sees a producer's every record, whichever topic it went to, as one numbered
sequence. With ``logging.log_dir`` set, metrics events and log records are also written to
this rank's local file (:mod:`rlpulse.producers.caller.rankfiles`), off the training thread.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from functools import cache, partial
from pathlib import Path
from types import TracebackType
from typing import get_args

from confluent_kafka import Consumer

from rlpulse.oncelog import WarnOnce
from rlpulse.producers.caller.rankfiles import RankFileSink
from rlpulse.producers.delivery.adoption import claim_dead_logs
from rlpulse.producers.delivery.sender import WalSender
from rlpulse.producers.delivery.shipper import HANDOVER_MAX, ShipperCounts
from rlpulse.producers.delivery.spool_root import SpoolRoot, resolve_spool_root
from rlpulse.producers.delivery.wal import EVENT, LOG, Frame, LogMeta, WalWriter, run_wal_dir
from rlpulse.producers.encoding.arguments import (
    LONG_MAX,
    LONG_MIN,
    bad_argument,
    require_int,
    require_run_id,
    string_map,
)
from rlpulse.producers.encoding.events import EventEncoder, EventSource, RefusedEvent
from rlpulse.producers.encoding.fields import EventFields, LogFields
from rlpulse.producers.encoding.logs import LogEncoder, LogSource
from rlpulse.producers.exceptions import (
    InvalidFieldError,
    InvalidValueError,
    ProducerClosedError,
    RefusedSourceError,
)
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.jsonl import LOG_KIND, metrics_line
from rlpulse.schemas.records import EventKind
from rlpulse.schemas.topics import Topics
from rlpulse.schemas.validation import (
    EventProblem,
    count_problem,
    name_problem,
    position_problem,
    run_problem,
    size_problem,
    stage_problem,
)
from rlpulse.settings import Settings
from rlpulse.transport.clients import ClientDiagnostics, new_consumer, trainer_producer
from rlpulse.transport.roles import control_group_prefix

log = logging.getLogger(__name__)

EVENT_KINDS: tuple[str, ...] = get_args(EventKind)
_TEXT_HEADROOM = 8192  # bytes of a log record's size limit kept for its other fields
_new_tuple = tuple.__new__  # a Frame without NamedTuple's Python-level __new__ (hot path)


@cache
def host_ip() -> str:
    """The address this machine's name resolves to (usually via ``/etc/hosts``), else ""."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return ""


class EventLogger:
    """Publishes one run's TrainerEvents from one process (one rank); never blocks, never loses.

    Construction does no I/O; the write-ahead log, the librdkafka producer and rlpulse's sender
    thread start with the first record. ``log()`` validates, stamps and encodes the record and
    appends it to the producer's write-ahead log (:mod:`rlpulse.producers.delivery.wal`: a copy into
    a memory-mapped file, no system call), so it is in the operating system's hands before the call
    returns and survives a SIGKILL of the process; the sender thread
    (:mod:`rlpulse.producers.delivery.sender`) sends it — events one per message, log records in
    batches — and, while the broker is out of reach, sends it later from the log.

    What a dead process of the run left on this host (SIGKILLed, OOM-killed, or closed before
    Kafka took everything) is sent by the next logger of the run on the host: from its start,
    on a thread of its own, whether or not it ever logs, it claims those logs (and looks again
    every ``producer.adopt_interval_s``), and its sender thread sends them; ``close()`` waits
    for them too. ``rlpulse replay`` sends what no process of the run comes back for.
    ``close()``, also run at interpreter exit, waits a bounded time for delivery.
    Transport trouble never raises: it shows in the counters and in ``logging``.
    ``producer_id`` (fixed per logger) and ``seq`` (0, 1, 2, ...) identify each record, and
    every record reaches its topic once.

    Create it in the process that logs (after any fork).
    """

    def __init__(
        self,
        run_id: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        attempt: int = 0,
        tags: Mapping[str, str] | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.run_id = require_run_id(run_id)
        self.rank = require_int("rank", rank, 0)
        self.world_size = require_int("world_size", world_size, 1)
        self.attempt = require_int("attempt", attempt, 0)
        self.tags = string_map("tags", tags)
        self.settings = settings if settings is not None else Settings()
        self.producer_id = uuid.uuid4().hex
        self.hostname = self.settings.producer.hostname or socket.gethostname()
        self._limits = self.settings.limits
        self._warn_once = WarnOnce(log)
        """This logger's memory of the kinds of trouble it warned about."""
        problem = run_problem(self.run_id, self.attempt, self._limits) or count_problem(
            0, len(self.tags), self._limits
        )
        for text in (self.producer_id, *self.tags, *self.tags.values()):
            problem = problem or name_problem(text, self._limits)
        if problem is not None:
            raise RefusedSourceError(
                f"run {self.run_id!r}: the worker would refuse every event of this logger: "
                f"{problem}"
            )
        self._spool_root: SpoolRoot | None = None
        self.adopted_left = 0
        """After :meth:`close`: records of dead producers' logs it was sending that Kafka had
        not acknowledged (they stay in their logs)."""
        self.refused: dict[str, int] = {}
        """Events ``log()`` refused because the worker would dead-letter them, per reason code."""
        self.last_step = 0
        """The step of the last metrics event of training (not the system sampler's); log
        records given no step get it, and so does the ``run_end`` a link sends at close."""
        topics = Topics(self.settings.prefix)
        self._topic = topics.events
        self._logs_topic = topics.logs
        self._log_encoder: LogEncoder | None = None
        self._records_enabled = self.settings.logging.enabled
        self._strict = self.settings.producer.strict
        logging_settings = self.settings.logging
        self.local: RankFileSink | None = None
        """This rank's local file (with ``logging.log_dir`` set), else None."""
        if logging_settings.log_dir is not None:
            self.local = RankFileSink(
                logging_settings.log_dir,
                logging_settings.component,
                self.rank,
                rotation_bytes=int(logging_settings.rotation),
                retention_s=logging_settings.retention,
                queue_max=logging_settings.queue_max,
            )
        self._key = self.run_id.encode()
        self._good_stages: set[str] = set()
        self._good_world_sizes: set[int] = set()  # each places this rank within the limits
        self._encoder = EventEncoder(
            EventSource(
                run_id=self.run_id,
                attempt=self.attempt,
                rank=self.rank,
                tags=self.tags,
                hostname=self.hostname,
                pid=os.getpid(),
                producer_id=self.producer_id,
            ),
            default_codec(),
            self._limits,
        )
        self._lock = threading.RLock()
        self._writer: WalWriter | None = None
        self._sender: WalSender | None = None
        self._handed: deque[Frame] = deque()
        self._at_exit: Callable[[], None] | None = None
        self._counts = ShipperCounts()
        self._not_written = 0
        self._read_back_diagnostics: ClientDiagnostics | None = None
        self._closed = False
        self._seq = 0
        self._replayed = 0
        self._adopt_stop = threading.Event()
        self._adopter = threading.Thread(
            target=_adopt_dead_logs,
            args=(weakref.ref(self), self._adopt_stop, self.settings.producer.adopt_interval_s),
            name=f"rlpulse-adopt-{self.run_id}",
            daemon=True,
        )
        self._adopter.start()

    @property
    def spool_dir(self) -> Path:
        """The run's directory of write-ahead logs (one per producer) on this host."""
        return run_wal_dir(self._spool().path, self.run_id, self.hostname)

    @property
    def wal_dir(self) -> Path:
        """The write-ahead log of this logger."""
        return self.spool_dir / self.producer_id

    def _spool(self) -> SpoolRoot:
        """Where the write-ahead logs live (looked up once: a read of the mount table)."""
        with self._lock:
            if self._spool_root is None:
                root = self._spool_root = resolve_spool_root(self.settings)
                if root.note is not None:
                    explicit = self.settings.producer.spool_dir is not None
                    log.log(logging.WARNING if explicit else logging.INFO, "%s", root.note)
            return self._spool_root

    def _adopt_once(self) -> None:
        """Claim the logs dead producers of the run left on this host; hand them to the sender."""
        sender = self._sender
        skip = {self.wal_dir, *(() if sender is None else sender.adopted)}
        for dead in claim_dead_logs(self.spool_dir, self.hostname, skip):
            with self._lock:
                if self._closed:  # close() no longer waits for this look
                    dead.claim.release()
                    continue
                if self._sender is None:
                    self._start()
                sender = self._sender
            assert sender is not None
            sender.adopt(dead)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (``log()`` then raises ``ProducerClosedError``)."""
        return self._closed

    @property
    def logged(self) -> int:
        """Events accepted by ``log()`` (the next ``seq``)."""
        return self._seq

    @property
    def delivered(self) -> int:
        """Logged records the broker acknowledged on their first delivery."""
        return self._counts.delivered

    @property
    def spooled(self) -> int:
        """Records whose delivery failed (the broker out of reach) and were sent again."""
        return self._counts.resent

    @property
    def replayed(self) -> int:
        """Records of dead producers of the same run on this host that this logger sent."""
        sender = self._sender
        return self._replayed if sender is None else sender.replayed

    @property
    def dropped(self) -> int:
        """Records lost: refused by the broker as invalid, or not written (log full, no disk)."""
        return self._counts.dropped + self._not_written

    @property
    def pending(self) -> int:
        """Records in the write-ahead log that Kafka has not acknowledged yet."""
        sender = self._sender
        return 0 if sender is None else sender.pending

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
        """Publish one event for ``step`` and ``stage``; returns in microseconds.

        Metric values may be anything ``float()`` accepts except strings (ints, numpy
        scalars, one-element tensors). ``world_size`` overrides the logger's for this
        event (stages run by fewer ranks).

        Bad input never raises into the training loop. An event with a value of the wrong
        type or range (a ``None`` or string metric, ``step=2.5``, an unknown ``kind``:
        codes ``<field>_type`` and ``<field>_value``, e.g. ``metrics_type``) or one the
        worker would dead-letter (a stage containing ``|``, a negative step, a rank outside
        ``world_size``, more metrics than ``limits.max_metrics``, names too long, too many
        bytes; see :mod:`rlpulse.schemas.validation`) is not sent and does not take a
        ``seq``: it is counted in :attr:`refused` under its reason code and logged once
        per code per process. With ``producer.strict`` on, the wrong types and ranges
        raise :class:`InvalidFieldError` (a ``TypeError``) or :class:`InvalidValueError`
        (a ``ValueError``) naming the field and key instead.
        """
        self.log_event(
            EventFields(
                kind, step, stage, world_size, metrics, level, message, policy_version, trace_id
            )
        )

    def log_event(self, event: EventFields, *, training_step: bool = True) -> None:
        """:meth:`log` with the event's fields as one value (what :class:`EventHandler` uses).

        ``training_step=False``: the event's step is not a step of training (the system
        sampler's sample index, :mod:`rlpulse.producers.caller.system`), so a metrics event leaves
        :attr:`last_step` at the trainer's.
        """
        if self._closed:
            raise ProducerClosedError(f"EventLogger for run {self.run_id!r} is closed")
        try:
            if event.kind not in EVENT_KINDS:
                raise InvalidValueError("kind", event.kind, EVENT_KINDS)
            if not isinstance(event.stage, str):
                raise InvalidFieldError("stage", None, event.stage, "a non-empty str")
            if event.level is not None or event.message is not None or event.trace_id is not None:
                for field, text in (
                    ("level", event.level), ("message", event.message), ("trace_id", event.trace_id)
                ):  # fmt: skip
                    if text is not None and not isinstance(text, str):
                        raise InvalidFieldError(field, None, text, "a str or None")
            step = event.step
            if type(step) is not int or not LONG_MIN <= step <= LONG_MAX:  # else it is one
                step = event.step = require_int("step", step, LONG_MIN, LONG_MAX)
            if event.world_size is None:
                event.world_size = self.world_size
            else:
                event.world_size = require_int("world_size", event.world_size, 1)
            if event.policy_version is not None:
                event.policy_version = require_int(
                    "policy_version", event.policy_version, LONG_MIN, LONG_MAX
                )
            stage, kind, metrics = event.stage, event.kind, event.metrics
            if kind in {"metrics", "log"}:
                problem = self._placement_problem(stage, step, event.world_size, metrics)
                if problem is not None:
                    self._refuse(problem)
                    return
            with self._lock:  # seq order is log order, whichever threads log
                if self._closed:  # close() ran since the check above
                    raise ProducerClosedError(f"EventLogger for run {self.run_id!r} is closed")
                seq = self._seq
                try:
                    value = self._encoder.encode(event, time.time_ns(), seq)
                except RefusedEvent as refused:
                    self._refuse(refused.problem)
                    return
                problem = size_problem(len(value), self._limits)
                if problem is not None:
                    self._refuse(problem)
                    return
                self._seq = seq + 1
                self._append(EVENT, seq, value)
            if kind == "metrics":
                if training_step:
                    self.last_step = step
                if self.local is not None:
                    self._write_metrics(step, stage, metrics, seq)
        except (InvalidFieldError, InvalidValueError) as exc:
            if self._strict:
                raise
            self._refuse(bad_argument(exc))

    def log_record(
        self,
        level: str,
        levelno: int,
        logger: str,
        message: str,
        *,
        step: int | None = None,
        stage: str = "trainer",
        exception: str | None = None,
        trace_id: str | None = None,
        fields: Mapping[str, str] | None = None,
        sample_rate: float = 1.0,
        sampled_out: Mapping[str, int] | None = None,
    ) -> None:
        """Publish one text log record to ``<prefix>.logs``; returns in microseconds.

        ``step`` defaults to the step of the last metrics event (:attr:`last_step`). Text
        longer than a record may hold is cut, with a note of how much. Does nothing with
        ``logging.enabled`` off. Like :meth:`log`, it never raises for transport trouble;
        a record the worker's limits would refuse (a bad stage) is counted in
        :attr:`refused` instead.
        """
        line = LogFields(
            step, stage, level, levelno, logger, message, exception, trace_id, fields,
            sample_rate, sampled_out,
        )  # fmt: skip
        self.log_line(line)

    def log_line(self, line: LogFields) -> None:
        """:meth:`log_record` with the record's fields as one value (``step`` None: the last)."""
        if not self._records_enabled:
            return
        if self._closed:
            raise ProducerClosedError(f"EventLogger for run {self.run_id!r} is closed")
        step = line.step
        if step is None:
            line.step = self.last_step
        elif type(step) is not int or not LONG_MIN <= step <= LONG_MAX:  # else the check is moot
            line.step = require_int("step", step, LONG_MIN, LONG_MAX)
        stage = line.stage
        if stage not in self._good_stages:
            problem = stage_problem(stage) or name_problem(stage, self._limits)
            if problem is not None:
                self._refuse(problem)
                return
            self._good_stages.add(stage)
        timestamp_ns = time.time_ns()
        with self._lock:
            if self._closed:
                raise ProducerClosedError(f"EventLogger for run {self.run_id!r} is closed")
            encoder = self._log_encoder or self._new_log_encoder()
            seq = self._seq
            value = encoder.entry(line, timestamp_ns, seq)
            size = len(encoder.head) + len(value)
            if size > self._limits.max_event_bytes:  # rare: only then ask why
                problem = size_problem(size, self._limits)
                if problem is not None:
                    self._refuse(problem)
                    return
            self._seq = seq + 1
            self._append(LOG, seq, value)
        if self.local is not None:
            self.local.put({"kind": LOG_KIND, **encoder.record(line, timestamp_ns, seq)})

    def _append(self, kind: int, seq: int, payload: bytes) -> None:
        """Append an encoded record to the write-ahead log (under the lock); wake the sender.

        A record the log cannot take (at ``producer.spool_max_bytes``, or the disk refuses)
        is counted in :attr:`dropped`, with one warning; it keeps its ``seq``, so the audit
        shows the loss as a gap.
        """
        if self._writer is None or self._sender is None:
            self._start()
        writer, sender = self._writer, self._sender
        assert writer is not None and sender is not None
        try:
            written = writer.append(kind, seq, payload)
        except OSError as exc:
            self._not_written += 1
            self._warn_once(
                "wal-error", "run %s: cannot write the write-ahead log %s (%s); records are "
                "dropped (counted in EventLogger.dropped)", self.run_id, self.wal_dir, exc,
            )  # fmt: skip
            return
        if written:
            handed = self._handed
            if len(handed) < HANDOVER_MAX:  # else the sender reads them back from the log
                handed.append(_new_tuple(Frame, (writer.start, writer.end, kind, seq, payload)))
        else:
            self._not_written += 1
            self._warn_once(
                "wal-full", "run %s: the write-ahead log %s holds producer.spool_max_bytes "
                "(%d bytes) Kafka has not taken yet; the newest records are dropped (counted "
                "in EventLogger.dropped)", self.run_id, self.wal_dir, writer.max_bytes,
            )  # fmt: skip
            return
        if kind == EVENT or sender.sleeping:
            sender.wake()

    def _new_log_encoder(self) -> LogEncoder:
        """The log record encoder, made with the first record (it resolves the host's IP).

        Its batches' shared head goes to the write-ahead log first, so that whoever sends
        the log (this process, or the next one after a kill) can build the batches.
        """
        encoder = LogEncoder(
            LogSource(
                run_id=self.run_id,
                attempt=self.attempt,
                rank=self.rank,
                tags=self.tags,
                hostname=self.hostname,
                host_ip=host_ip(),
                pid=os.getpid(),
                producer_id=self.producer_id,
            ),
            default_codec(),
            max(256, (self._limits.max_event_bytes - _TEXT_HEADROOM) // 2),
        )
        if self._writer is None:
            self._start()
        assert self._writer is not None
        try:
            self._writer.write_source(encoder.head)
        except OSError as exc:  # the records' appends will fail the same way, and say so
            log.debug("run %s: cannot write %s: %s", self.run_id, self.wal_dir, exc)
        self._log_encoder = encoder
        return encoder

    def _write_metrics(self, step: int, stage: str, metrics: Mapping[str, float], seq: int) -> None:
        """Hand a metrics event's line to the local file (:func:`metrics_line`, as every writer).

        A line the layout cannot hold (a metric named like one of the line's own fields) is
        left out of the file, counted in the file's ``refused`` and warned once; the event
        itself was accepted and is sent.
        """
        local = self.local
        assert local is not None
        extra = {
            "run_id": self.run_id,
            "attempt": self.attempt,
            "producer_id": self.producer_id,
            "seq": seq,
        }
        try:
            line = metrics_line(
                step,
                stage,
                self.rank,
                metrics,
                timestamp_ns=time.time_ns(),
                hostname=self.hostname,
                pid=os.getpid(),
                extra=extra,
            )
        except ValueError as exc:
            local.refused += 1
            self._warn_once(
                "local-line", "run %s: a metrics event's line is not written to %s: %s (the "
                "event is sent; such lines are counted in EventLogger.local.refused)",
                self.run_id, local.path, exc,
            )  # fmt: skip
            return
        local.put(line)

    def _placement_problem(
        self, stage: str, step: int, world_size: int, metrics: Mapping[str, float]
    ) -> EventProblem | None:
        """What the worker would refuse about where this event goes and how many metrics."""
        if (
            step >= 0
            and stage in self._good_stages
            and world_size in self._good_world_sizes
            and type(metrics) is dict
            and len(metrics) <= self._limits.max_metrics
        ):
            return None  # what every event of a healthy run takes: no call below
        if stage not in self._good_stages:
            problem = stage_problem(stage) or name_problem(stage, self._limits)
            if problem is not None:
                return problem
            self._good_stages.add(stage)
        problem = position_problem(step, self.rank, world_size, self._limits)
        if problem is not None:
            return problem
        self._good_world_sizes.add(world_size)
        if isinstance(metrics, Mapping):
            return count_problem(len(metrics), len(self.tags), self._limits)
        return None

    def _refuse(self, problem: EventProblem) -> None:
        with self._lock:
            self.refused[problem.code] = self.refused.get(problem.code, 0) + 1
        self._warn_once(
            problem.code,
            "run %s rank %d: an event was not sent: %s "
            "(later ones refused for this reason are counted in EventLogger.refused[%r], "
            "not logged)",
            self.run_id,
            self.rank,
            problem,
            problem.code,
        )

    def run_start(self, step: int = 0) -> None:
        """Publish a ``run_start`` event (``step`` is where this attempt starts)."""
        self.log({}, step, kind="run_start")

    def run_end(self, step: int, reason: str | None = None) -> None:
        """Publish a ``run_end`` event, ``reason`` as its message; the joiner closes open steps.

        It sends one each call:
        :meth:`RunLink.run_end <rlpulse.producers.caller.link.RunLink.run_end>` is the
        once-per-run, rank-0-only way.
        """
        self.log({}, step, kind="run_end", message=reason)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait up to ``timeout_s`` until Kafka acknowledged every record logged so far.

        Returns how many of them are still waiting; they are safe in the write-ahead log either
        way. Records other threads log meanwhile (system metrics, a log handler) are neither
        waited for nor counted; :attr:`pending` counts everything.
        """
        if self.local is not None:
            self.local.flush(timeout_s)
        sender = self._sender
        return 0 if sender is None else sender.wait_delivered(timeout_s)

    def close(self, timeout_s: float | None = None) -> int:
        """Send for up to ``timeout_s`` (default ``producer.close_timeout_s``), then stop.

        Waits for this logger's records and for the dead producers' logs it adopted (its look
        at start included). Returns how many of this logger's records Kafka had not
        acknowledged by then; :attr:`adopted_left` says the same of the adopted logs. They
        stay in their write-ahead logs, sent by the next process of this run on this host or
        by ``rlpulse replay``; a log that was delivered whole is deleted. Calling it again does
        nothing and returns 0.
        """
        close_s = self.settings.producer.close_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + close_s
        self._adopt_stop.set()
        if self._adopter is not threading.current_thread():
            self._adopter.join(close_s)  # the look under way hands its logs over first
        with self._lock:
            if self._closed:
                return 0
            self._closed = True
            sender, self._sender, self._writer = self._sender, None, None
        if self.local is not None:
            self.local.close()
        if sender is None:
            return 0
        if self._at_exit is not None:
            atexit.unregister(self._at_exit)
        left = sender.close(max(0.0, deadline - time.monotonic()))
        self._replayed = sender.replayed
        kept = sender.adopted_left
        if left:
            log.warning(
                "run %s: %d record(s) were still undelivered at close(); they wait in %s, sent "
                "by the next process of this run on this host, or by `rlpulse replay %s`",
                self.run_id,
                left,
                self.wal_dir,
                self.spool_dir,
            )
        if kept:
            log.warning(
                "run %s: %d record(s) of %d dead producer(s)' log(s) this process was sending "
                "were still undelivered at close() (%s); they wait in %s for the next process "
                "of this run on this host, or `rlpulse replay %s`",
                self.run_id,
                sum(records for _path, records, _why in kept),
                len(kept),
                "; ".join(sorted({why for _path, _records, why in kept if why})) or "time",
                ", ".join(str(path) for path, _records, _why in kept),
                self.spool_dir,
            )
        self.adopted_left = sum(records for _path, records, _why in kept)
        return left

    def __enter__(self) -> EventLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _start(self) -> None:
        """Create the write-ahead log, the producer and the sender thread (under the lock)."""
        label = f"event logger of run {self.run_id}"
        producer_settings = self.settings.producer
        meta = LogMeta(
            self.wal_dir, self.run_id, self.producer_id, self._topic, self._logs_topic,
            time.time_ns(), self.hostname, os.getpid(),
        )  # fmt: skip
        self._writer = WalWriter(
            meta,
            segment_bytes=producer_settings.spool_file_bytes,
            max_bytes=producer_settings.spool_max_bytes,
        )
        self._sender = WalSender(
            trainer_producer(self.settings, label),
            self._writer,
            self._read_back_consumer,
            linger_s=producer_settings.batch_linger_ms / 1000,
            batch_max_bytes=self.settings.logging.batch_max_bytes,
            label=label,
        )
        self._counts = self._sender.counts
        self._handed = self._sender.handed
        self._at_exit = partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    def _read_back_consumer(self) -> Consumer:
        """A consumer for the sender's read-back (assigned partitions only, never commits).

        Its errors go through one :class:`ClientDiagnostics` per logger: each kind is said
        once however many read-backs a long outage takes.
        """
        group = f"{control_group_prefix(self.settings.prefix)}readback"
        client = f"read-back of run {self.run_id}"
        if self._read_back_diagnostics is None:
            self._read_back_diagnostics = ClientDiagnostics(client, self.settings)
        return new_consumer(self.settings, group, client, diagnostics=self._read_back_diagnostics)


def _adopt_dead_logs(ref: weakref.ref[EventLogger], stop: threading.Event, every_s: float) -> None:
    """The logger's adoption thread: a look at start, then every ``every_s`` until closed.

    It holds the logger only while it looks, so a logger the program drops still goes.
    """
    while True:
        logger = ref()
        if logger is None or logger.closed:
            return
        try:
            logger._adopt_once()
        except Exception:  # a look that failed must not end the next ones
            log.exception("run %s: looking for dead producers' logs failed", logger.run_id)
        del logger
        if stop.wait(every_s):
            return


def _close_at_exit(ref: weakref.ref[EventLogger]) -> None:
    """Close a logger the program left open (``atexit``), within its ``close_timeout_s``."""
    logger = ref()
    if logger is not None:
        logger.close()
