"""The run-scoped event logger: TrainerEvents to ``<prefix>.events``, log records to ``.logs``.

Both kinds share one write-ahead log and one ``seq`` counter, so the archive's audit sees a
producer's every record, whichever topic it went to, as one numbered sequence; the host's
agent (:mod:`rlpulse.producers.delivery.agent`) sends the log. With ``logging.log_dir`` set,
metrics events and log records are also written to this rank's local file
(:mod:`rlpulse.producers.caller.rankfiles`), off the training thread.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cache, partial
from pathlib import Path
from typing import Final, get_args

from rlpulse.closing import ClosedByWith
from rlpulse.diagnostics import WarnOnce
from rlpulse.diagnostics import install as install_diagnostics
from rlpulse.producers.caller.rankfiles import RankFileSink
from rlpulse.producers.caller.sample_log import SampleCounts, SampleLog, samples_log_dir
from rlpulse.producers.caller.samples import (
    RawText,
    SampleProblem,
    chosen_texts,
    columns_from_mappings,
    step_statistics,
)
from rlpulse.producers.caller.stacks import STACKS_DIRECTORY, enable_stack_dumps
from rlpulse.producers.delivery.agent_place import AgentBell, AgentPlace
from rlpulse.producers.delivery.agent_process import place_for, start_detached
from rlpulse.producers.delivery.spool_root import SpoolRoot, resolve_spool_root
from rlpulse.producers.delivery.wal import (
    EVENT,
    EVENTS_PROTOCOL,
    LOG,
    AckFile,
    AckState,
    LogMeta,
    WalWriter,
    run_wal_dir,
)
from rlpulse.producers.delivery.watch import AgentWatch, watch_agent
from rlpulse.producers.encoding.arguments import (
    LONG_MAX,
    LONG_MIN,
    bad_argument,
    require_int,
    require_run_id,
    string_map,
)
from rlpulse.producers.encoding.events import EventEncoder, RefusedEvent
from rlpulse.producers.encoding.fields import EventFields, LogFields, RecordSource
from rlpulse.producers.encoding.logs import LogEncoder
from rlpulse.producers.encoding.samples import Ints, SampleColumns, TextEntry
from rlpulse.producers.exceptions import (
    InvalidFieldError,
    InvalidValueError,
    ProducerClosedError,
    RefusedSourceError,
)
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.jsonl import LOG_KIND, metrics_line
from rlpulse.schemas.records import EventKind, SampleSplit
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

log = logging.getLogger(__name__)

EVENT_KINDS: tuple[str, ...] = get_args(EventKind)
_TEXT_HEADROOM = 8192  # bytes of a log record's size limit kept for its other fields
_DELIVERY_POLL_S: Final = 0.005


@cache
def host_ip() -> str:
    """The address this machine's name resolves to (usually via ``/etc/hosts``), else ""."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return ""


class EventLogger(ClosedByWith):
    """Publishes one run's TrainerEvents from one process (one rank); never blocks, never loses.

    Construction does no I/O; the write-ahead log starts with the first record. ``log()``
    validates, stamps and encodes the record and appends it to the producer's write-ahead log
    (:mod:`rlpulse.producers.delivery.wal`: a copy into a memory-mapped file, no system call),
    so it is in the operating system's hands before the call returns and survives a SIGKILL
    of the process. The training process holds no Kafka producer and no sender thread: the
    host's agent (:mod:`rlpulse.producers.delivery.agent`, one process per host and cluster)
    sends the log — events one per message, log records in batches — and, while the broker is
    out of reach, later, from the log; it sends what a killed process left as soon as it is
    gone. ``log()`` wakes a sleeping agent (a mapped byte says whether it sleeps: nothing
    per record while it is awake). A thread of the process checks every
    ``agent.check_interval_s`` that the agent lives and starts one when none does
    (:mod:`rlpulse.producers.delivery.watch`).
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
        redact: Callable[[str], str] | None = None,
    ) -> None:
        install_diagnostics()  # its warnings reach stderr whatever handlers the program has
        self.run_id = require_run_id(run_id)
        self.rank = require_int("rank", rank, 0)
        self.world_size = require_int("world_size", world_size, 1)
        self.attempt = require_int("attempt", attempt, 0)
        self.tags = string_map("tags", tags)
        self.settings = settings if settings is not None else Settings()
        self.producer_id = uuid.uuid4().hex
        self.hostname = self.settings.producer.hostname or socket.gethostname()
        self._made_by = threading.get_ident()  # the training loop's thread, first in its stacks
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
        self._source = RecordSource(
            run_id=self.run_id,
            attempt=self.attempt,
            rank=self.rank,
            tags=self.tags,
            hostname=self.hostname,
            host_ip="",  # resolved with the first log record: construction does no I/O
            pid=os.getpid(),
            producer_id=self.producer_id,
        )
        self._encoder = EventEncoder(self._source, default_codec(), self._limits)
        self._lock = threading.RLock()
        self._writer: WalWriter | None = None
        self._bell: AgentBell | None = None
        self._watch: AgentWatch | None = None
        self._at_exit: Callable[[], None] | None = None
        self._not_written = 0
        self._closed = False
        self._final: AckState | None = None
        self._no_agent = ""
        self._seq = 0
        self._sample_log: SampleLog | None = None
        self._sample_counts = SampleCounts()
        self._redact = redact

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
        return self._acked().delivered

    @property
    def resent(self) -> int:
        """Records whose delivery failed (the broker out of reach) and were sent again."""
        return self._acked().resent

    @property
    def spooled(self) -> int:
        """Deprecated: the old name of :attr:`resent` (it counted records sent again)."""
        warnings.warn(
            "EventLogger.spooled is deprecated: it is EventLogger.resent",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.resent

    @property
    def dropped(self) -> int:
        """Records lost: refused by the broker as invalid, or not written (log full, no disk)."""
        return self._acked().dropped + self._not_written

    @property
    def pending(self) -> int:
        """Records in the write-ahead log that Kafka has not acknowledged yet."""
        writer = self._writer
        return 0 if writer is None else max(0, writer.frames - self._acked().frames)

    @property
    def agent(self) -> AgentPlace | None:
        """The host's agent that sends this logger's log (None before the first record)."""
        bell = self._bell
        return None if bell is None else bell.place

    def _acked(self) -> AckState:
        """What the agent recorded of this logger's log (the ``acked`` file)."""
        if self._final is not None:
            return self._final
        if self._writer is None:
            return AckState()
        return AckFile.read(self.wal_dir)

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
        """Append an encoded record to the write-ahead log (under the lock); wake the agent.

        A record the log cannot take (at ``producer.spool_max_bytes``, or the disk refuses)
        is counted in :attr:`dropped`, with one warning; it keeps its ``seq``, so the audit
        shows the loss as a gap.
        """
        writer = self._writer
        if writer is None:
            writer = self._start()
        try:
            written = writer.append(kind, seq, payload)
        except OSError as exc:
            self._not_written += 1
            self._warn_once(
                "wal-error", "run %s: cannot write the write-ahead log %s (%s); records are "
                "dropped (counted in EventLogger.dropped)", self.run_id, self.wal_dir, exc,
            )  # fmt: skip
            return
        if not written:
            self._not_written += 1
            self._warn_once(
                "wal-full", "run %s: the write-ahead log %s holds producer.spool_max_bytes "
                "(%d bytes) Kafka has not taken yet; the newest records are dropped (counted "
                "in EventLogger.dropped)", self.run_id, self.wal_dir, writer.max_bytes,
            )  # fmt: skip
            return
        bell = self._bell
        if bell is not None and bell.state[0]:  # the agent sleeps: wake it if this needs it
            bell.ring(kind)

    def _new_log_encoder(self) -> LogEncoder:
        """The log record encoder, made with the first record (it resolves the host's IP).

        Its batches' shared head goes to the write-ahead log first, so that whoever sends
        the log (this process, or the next one after a kill) can build the batches.
        """
        encoder = LogEncoder(
            replace(self._source, host_ip=host_ip()),
            default_codec(),
            max(256, (self._limits.max_event_bytes - _TEXT_HEADROOM) // 2),
        )
        writer = self._writer if self._writer is not None else self._start()
        try:
            writer.write_source(encoder.head)
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

    @property
    def samples(self) -> SampleCounts:
        """What became of this logger's rollout samples (:meth:`log_samples`)."""
        sample_log = self._sample_log
        return sample_log.counts if sample_log is not None else self._sample_counts

    def log_samples(
        self,
        samples: Sequence[Mapping[str, object]],
        step: int,
        *,
        split: SampleSplit = "train",
        world_size: int | None = None,
    ) -> None:
        """Publish one step's rollout samples: every sample's numbers, a few chosen texts.

        Each sample is a mapping with ``prompt``, ``response`` (str) and ``reward`` (a
        number) and, optional, ``scores`` (name -> number), ``group`` (the samples of one
        prompt), ``data_source``, ``prompt_length`` and ``response_length`` (tokens; the
        texts' characters if left out), ``truncated``, ``advantage``, ``ground_truth``,
        ``aborted``, ``num_turns`` and ``response_ids`` (the response's token ids: its
        repetition score is then computed on them). The numbers go to ``<prefix>.samples``,
        the texts of ``samples.text_count`` chosen samples (:mod:`rlpulse.producers.caller.samples`)
        to ``<prefix>.sample-texts``, cut to ``samples.max_text_chars`` and redacted first;
        the step's statistics over all its samples are an event of stage ``samples`` (or
        ``validation_samples``), so rules act on them; ``world_size`` is how many ranks log
        samples for the step (default: the logger's; 1 where only rank 0 does).

        A malformed sample (no ``response``, a reward that is a string) is left out, counted
        in ``samples.refused[key]`` and said once per key with its index; the rest of the
        step is kept. Like :meth:`log`, it never raises for transport trouble (with
        ``producer.strict`` on, a malformed sample raises ``ValueError``).
        """
        if self._closed:
            raise ProducerClosedError(f"EventLogger for run {self.run_id!r} is closed")
        settings = self.settings.samples
        if not settings.enabled:
            return
        try:
            step = require_int("step", step, 0, LONG_MAX)
            if not isinstance(samples, Sequence) or isinstance(samples, str | bytes):
                raise InvalidFieldError("samples", None, samples, "a sequence of mappings")
        except (InvalidFieldError, InvalidValueError) as exc:
            if self._strict:
                raise
            self._refuse(bad_argument(exc))
            return
        columns, texts, identity, problems = columns_from_mappings(samples)
        if problems:
            self._refuse_samples(problems)
        self.log_sample_columns(columns, identity, texts.__getitem__, step, split, world_size)

    def log_sample_columns(
        self,
        columns: SampleColumns,
        identity: Ints,
        text_of: Callable[[int], RawText] | None,
        step: int,
        split: SampleSplit = "train",
        world_size: int | None = None,
    ) -> None:
        """:meth:`log_samples` for a capture that holds its samples as columns already.

        ``identity`` says which responses are equal (:func:`~rlpulse.producers.caller.samples.
        response_identity`); ``text_of(i)`` gives sample ``i``'s texts, and is called only
        for the chosen ones (an integration decodes just those). None: no texts.
        """
        settings = self.settings.samples
        if not settings.enabled:
            return
        if self._closed:
            raise ProducerClosedError(f"EventLogger for run {self.run_id!r} is closed")
        statistics = step_statistics(columns, identity, settings.repetition_threshold)
        entries: list[TextEntry] = []
        if settings.texts and text_of is not None and step % settings.texts_every_steps == 0:
            try:
                entries = chosen_texts(columns, text_of, settings, step, self._redaction())
            except Exception as exc:  # the caller's redaction or decoding: no text leaves
                self._warn_once(
                    "sample-texts", "run %s rank %d: no rollout sample texts are sent for step "
                    "%d: %r (the numbers are; said once)", self.run_id, self.rank, step, exc,
                )  # fmt: skip
        if len(columns) or entries:
            sample_log = self._sample_log or self._new_sample_log()
            sample_log.write(columns, entries, step, split)
        stage = "samples" if split == "train" else "validation_samples"
        self.log(statistics, step, stage=stage, world_size=world_size or self.world_size)

    def _redaction(self) -> Callable[[str], str] | None:
        """The redaction hook: the one given to the logger, else ``samples.redact``'s."""
        if self._redact is None and self.settings.samples.redact is not None:
            self._redact = load_redaction(self.settings.samples.redact)
        return self._redact

    def _refuse_samples(self, problems: list[SampleProblem]) -> None:
        if self._strict:
            raise ValueError(f"run {self.run_id!r}: {problems[0]}")
        counts = self.samples
        for problem in problems:
            counts.refused[problem.key] = counts.refused.get(problem.key, 0) + 1
            self._warn_once(
                f"sample-{problem.key}",
                "run %s rank %d: a rollout sample was left out: %s (later ones left out for "
                "this key are counted in EventLogger.samples.refused[%r], not logged)",
                self.run_id, self.rank, problem, problem.key,
            )  # fmt: skip

    def _new_sample_log(self) -> SampleLog:
        """The samples log, made with the first samples (beside the events log)."""
        with self._lock:
            if self._sample_log is not None:
                return self._sample_log
            if self._writer is None:
                self._start()
            place = place_for(self.settings, self._spool())
            directory = samples_log_dir(self.wal_dir)
            source = replace(self._source, producer_id=directory.name)
            bell = self._bell
            sample_log = SampleLog(
                source,
                directory,
                self.settings,
                place.key,
                bell,
                on_first_segment=(
                    (lambda: bell.register(directory)) if bell is not None else (lambda: None)
                ),
            )
            sample_log.counts.refused.update(self._sample_counts.refused)
            self._sample_log = sample_log
            return sample_log

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
        way (the agent sends them). Records other threads log meanwhile (system metrics, a log
        handler) are neither waited for nor counted; :attr:`pending` counts everything.
        """
        if self.local is not None:
            self.local.flush(timeout_s)
        writer = self._writer
        if writer is None:
            return 0
        deadline = time.monotonic() + timeout_s
        left = self._wait_delivered(writer.frames, deadline)
        if self._sample_log is not None:
            left += self._sample_log.wait_delivered(deadline)
        return left

    def _wait_delivered(self, frames: int, deadline: float) -> int:
        """Wait until the agent acknowledged ``frames`` frames of the log, or ``deadline``.

        Wakes the agent first (it may sleep over log records held for the linger); returns
        how many of them are not acknowledged.
        """
        if self._bell is not None:
            self._bell.send(b"\n")
        while True:
            done = AckFile.read(self.wal_dir).frames
            if done >= frames or time.monotonic() >= deadline:
                return max(0, frames - done)
            time.sleep(_DELIVERY_POLL_S)

    def close(self, timeout_s: float | None = None) -> int:
        """Wait up to ``timeout_s`` (default ``producer.close_timeout_s``) for delivery; stop.

        Returns how many of this logger's records Kafka had not acknowledged by then. They are
        safe in the write-ahead log: the host's agent goes on sending them after this process
        is gone, and deletes the log once every record arrived. Calling it again does nothing
        and returns 0.
        """
        close_s = self.settings.producer.close_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + close_s
        with self._lock:
            if self._closed:
                return 0
            self._closed = True
            writer = self._writer
        if self.local is not None:
            self.local.close()
        if writer is None:
            return 0
        if self._at_exit is not None:
            atexit.unregister(self._at_exit)
        left = self._wait_delivered(writer.frames, deadline)
        sample_log = self._sample_log
        if sample_log is not None:
            left += sample_log.wait_delivered(deadline)
            sample_log.close()
        self._final = AckFile.read(self.wal_dir)
        writer.close()  # the writer is gone: the agent deletes the log once all of it arrived
        if self._bell is not None:
            self._bell.send(b"-" + os.fsencode(self.wal_dir) + b"\n")
            self._bell.close()
        if self._watch is not None:
            self._watch.release()
        if left:
            log.warning(
                "run %s: %d record(s) were still undelivered at close(); they wait in %s for "
                "the host's agent, or `rlpulse spool send` where none runs (`rlpulse spool "
                "list` shows which)",
                self.run_id,
                left,
                self.wal_dir,
            )
        return left

    def _start(self) -> WalWriter:
        """Create the write-ahead log; find (or have started) the host's agent (under the lock).

        Where the agent's directory cannot be made, records are still written to the log
        (``rlpulse spool send`` sends them) and the watch says why no agent can run.
        """
        producer_settings = self.settings.producer
        spool = self._spool()
        place = place_for(self.settings, spool)
        dump = enable_stack_dumps(
            self.settings.agent.stacks_signal, place.directory / STACKS_DIRECTORY
        )
        meta = LogMeta(
            self.wal_dir, self.run_id, self.producer_id, self._topic, self._logs_topic,
            time.time_ns(), self.hostname, os.getpid(), place.key, EVENTS_PROTOCOL, self.rank,
            self.attempt, self._made_by, None if dump is None else dump.signum,
            None if dump is None else str(dump.path),
        )  # fmt: skip
        try:
            self._bell = AgentBell(place)
        except OSError as exc:  # said once the log is written (else the log's error says it)
            self._no_agent = f"{place.directory}: {exc.strerror or exc}"
        bell = self._bell
        self._writer = WalWriter(
            meta,
            segment_bytes=producer_settings.spool_file_bytes,
            max_bytes=producer_settings.spool_max_bytes,
            on_first_segment=partial(self._told_agent, bell),
        )
        if bell is not None:
            self._watch = watch_agent(place, self.settings, start_detached)
        self._at_exit = partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)
        return self._writer

    def _told_agent(self, bell: AgentBell | None) -> None:
        """The log's first segment exists: tell the agent, or say once that none can run."""
        if bell is not None:
            bell.register(self.wal_dir)
        else:
            self._warn_once(
                "agent-place", "run %s: the host's agent cannot run (%s); records wait in %s "
                "for `rlpulse spool send`", self.run_id, self._no_agent, self.wal_dir,
            )  # fmt: skip


def _close_at_exit(ref: weakref.ref[EventLogger]) -> None:
    """Close a logger the program left open (``atexit``), within its ``close_timeout_s``."""
    logger = ref()
    if logger is not None:
        logger.close()


def load_redaction(spec: str) -> Callable[[str], str]:
    """The function ``module:function`` names (``samples.redact``); a clear error if none."""
    import importlib

    module_name, _, name = spec.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"samples.redact {spec!r}: {exc}") from exc
    if not callable(function):
        raise ValueError(f"samples.redact {spec!r} is not callable")
    return function  # type: ignore[no-any-return]
