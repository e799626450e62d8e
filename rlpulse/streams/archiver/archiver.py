"""The archiver: every rlpulse topic to Parquet, effectively once, rolled, retained, audited.

One process is one member of the consumer group ``<prefix>-archive`` (Kafka spreads the
partitions of all topics over the members: run more processes for more throughput). Per
partition it buffers what it reads (:class:`~rlpulse.streams.archiver.buffer.PartitionBuffer`)
and writes it out as one *flush* when the buffer holds ``roll_bytes`` of messages or its
oldest one waited ``roll_s``, when the partition is taken away (rebalance), and at stop.

A SIGKILLed archiver's partitions wait for ``session_timeout_s`` before the group hands them
on; with ``instance_id`` set (static membership) a restarted archiver gets them back at once.

Effectively once. The files are the truth about what is archived
(:mod:`rlpulse.archive.layout`): on getting a partition, the archiver lists its
files, deletes an unfinished newest flush (and temporary files) that a crash left, and
seeks to the offset after the last complete flush, or to the beginning when there is none.
A flush is written to temporary files, fsynced, and renamed only when all of them are on
disk. So a crash at any moment loses nothing (what was not renamed is read again) and
duplicates nothing (what was renamed is not). Offsets are committed after each flush only
as a hint, for lag monitoring; they are never read. Two processes write the same partition
only if one of them is a zombie past ``max.poll.interval.ms`` (5 minutes) in the middle of
a flush; the audit would show the duplicates.

Flushes are written on one writer thread (:class:`~rlpulse.streams.archiver.writer.FlushWriter`),
in the order they were made, while the next messages are decoded; after a failed flush no
later one is written and :meth:`Archiver.run` raises the failure. Where flushes must be on
disk (a partition revoked or assigned, an audit, the stop), the archiver waits for it. The
writer hands each flush's offset hint back; the consuming thread commits it.

Topics: at start the archiver creates the ``<prefix>.*`` topics no worker has created yet
and says which. Where it may not (a principal that may only read), it says so: a topic
created later is archived within ``METADATA_REFRESH_S`` of its creation.

Retention: every ``prune_interval_s``, :func:`~rlpulse.streams.archiver.prune.prune`.

Audits: a ``run_end`` event schedules an audit of its run ``audit_delay_s`` later; so does
silence: a run whose last event this archiver read was not a ``run_end`` and that sent no
event for ``audit_silent_after_s`` more (its trainer died, or ended without a ``run_end``)
is audited then, its report saying so. A run that sends again after its audit is audited
again when it ends or falls silent again. Only events count (a run's events, run_end
included, are all in one partition, so the one archiver that owns it sees both), measured
from when this archiver read them: a restarted archiver does not audit the silent runs its
predecessor had archived in full (``rlpulse audit`` does, on demand).

For an audit, the archiver notes the end offsets of every events and logs partition,
writes out its own buffers, and waits (up to ``audit_wait_s``) until the archive holds
every partition up to those offsets (other archivers write theirs within ``roll_s``); then
it audits the run (:mod:`rlpulse.archive.audit`) and publishes the report to
``<prefix>.audits``.
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from rlpulse.archive.audit import audit_runs
from rlpulse.archive.catalog import open_archive
from rlpulse.archive.exceptions import ArchiveError
from rlpulse.archive.layout import FileName, plan_resume
from rlpulse.archive.store import ArchiveStore
from rlpulse.archive.tables import Table, tables_of
from rlpulse.diagnostics import WarnOnce
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.streams.archiver.buffer import PartitionBuffer
from rlpulse.streams.archiver.prune import cutoff_ms, prune
from rlpulse.streams.archiver.writer import FlushWriter
from rlpulse.transport.clients import is_fatal, new_producer
from rlpulse.transport.group import Fetching, join_group
from rlpulse.transport.readiness import Deadline, wait_for_kafka
from rlpulse.transport.topics import ensure_topics_for_reader

__all__ = ["Archiver", "ArchiverCounts"]

log = logging.getLogger(__name__)
Say = Callable[[str], None]
POLL_S = 0.5
AUDIT_RECHECK_S = 2.0
SILENCE_CHECK_S = 1.0
WATERMARK_TIMEOUT_S = 10.0
METADATA_REFRESH_S = 10.0
"""How soon the consumer finds a subscribed topic that was created after it started."""
FETCHING = Fetching(min_bytes=256 * 1024, wait_max_ms=200, metadata_refresh_s=METADATA_REFRESH_S)
"""Fewer, fuller fetches: the broker's work is per request; records wait for a buffer's roll
anyway."""


@dataclass
class ArchiverCounts:
    """What one archiver process did."""

    records: int = 0
    """Records (rows) written to the archive: a LogBatch message holds many."""
    flushes: int = 0
    files: int = 0
    undecodable: int = 0
    """Messages kept as ``decode_error`` rows."""
    recovered: int = 0
    """Unfinished flushes found (and redone) on getting a partition."""
    pruned: int = 0
    """Files deleted for retention."""
    audits: int = 0
    silent_audits: int = 0
    """Audits of runs that fell silent without a ``run_end`` (counted in ``audits`` too)."""


@dataclass
class _PendingAudit:
    run_id: str
    due: float
    silent_s: float | None = None
    """None after a ``run_end``; else how long the run had been silent."""
    targets: dict[tuple[str, int], int] | None = None
    targets_at: float = 0.0
    deadline: float = 0.0
    behind: list[str] = field(default_factory=list)


class Archiver:
    """One archiver process: call :meth:`run` (blocks), :meth:`stop` from a signal handler."""

    def __init__(
        self, settings: Settings, say: Say | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.topics = Topics(settings.prefix)
        self.codec = default_codec()
        self.tables = tables_of(self.topics, self.codec)
        self.store = ArchiveStore(settings.archive_root, settings.archive)
        self.counts = ArchiverCounts()
        self._by_topic: dict[str, Table] = {table.topic: table for table in self.tables.values()}
        self._events = self.topics.events
        self._buffers: dict[tuple[str, int], PartitionBuffer] = {}
        self._expected: dict[tuple[str, int], int] = {}
        self._say = say or log.info
        self._clock = clock
        self._stop = threading.Event()
        self._consumer: Consumer | None = None
        self._writer: FlushWriter | None = None
        """Writes the flushes while :meth:`run` runs."""
        self._hints: deque[tuple[str, int, int]] = deque()
        """(topic, partition, next offset) of each flush written, for :meth:`_commit_hints`."""
        self._audits: dict[str, _PendingAudit] = {}
        # run -> (when its last event, not a run_end, was read; its events partition)
        self._heard: dict[str, tuple[float, int]] = {}
        self._watched = (
            self.topics.events,
            self.topics.logs,
            self.topics.samples,
            self.topics.sample_texts,
        )
        self._next_silence_check = 0.0
        self._next_prune = 0.0
        self._warn = WarnOnce(log)

    def stop(self) -> None:
        """Ask :meth:`run` to write out what it holds and return."""
        self._stop.set()

    def run(self) -> ArchiverCounts:
        """Archive until :meth:`stop`; write out the buffers, leave the group, return the counts."""
        archive = self.settings.archive
        deadline = Deadline(archive.startup_timeout_s)
        self.store.prepare()
        wait_for_kafka(self.settings, deadline, self._say)
        ensure_topics_for_reader(self.settings, deadline.left(), METADATA_REFRESH_S, self._say)
        consumer = self._consumer = join_group(
            self.settings,
            self.settings.archive_group,
            "archiver",
            list(self._by_topic),
            archive,
            FETCHING,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
            overrides={"enable.partition.eof": False},
        )
        writer = self._writer = FlushWriter()
        writer.start()
        young = gc.get_threshold()
        # Decoding makes a few objects per record, none in a cycle: young collections every
        # 700 allocations would spend the drain's time looking at what is buffered.
        gc.set_threshold(archive.gc_threshold, *young[1:])
        try:
            while not self._stop.is_set():
                writer.check()
                self._take_all(consumer.consume(archive.batch_max, POLL_S))
                now = time.monotonic()
                self._roll(now)
                self._prune_if_due(now)
                self._audit_silent(now)
                self._audit_if_due(now)
                self._commit_hints()
        finally:
            gc.set_threshold(*young)
            try:
                if writer.error is None:  # after a failed flush, nothing more is written
                    self._flush_all()
                    writer.wait()
            finally:
                writer.close()
                self._writer = None
                # Left only after a failure: read again by the partitions' next owner.
                self._buffers.clear()
                self._commit_hints()
                consumer.close()
                self._consumer = None
        return self.counts

    # -- partitions -------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._written()  # a partition lost with flushes queued may come back: list them all
        listings: dict[str, list[tuple[str, FileName]]] = {}
        for tp in partitions:
            files = listings.get(tp.topic)
            if files is None:
                files = listings[tp.topic] = self.store.files(tp.topic)
            plan = plan_resume(files, tp.partition)
            leftovers = self.store.temp_files(tp.topic, tp.partition)
            if plan.incomplete or leftovers:
                self.store.delete(plan.incomplete + leftovers)
                self.counts.recovered += 1
                resume = (
                    "the beginning" if plan.next_offset is None else f"offset {plan.next_offset}"
                )
                self._say(
                    f"{tp.topic} partition {tp.partition}: an unfinished flush "
                    f"({len(plan.incomplete)} file(s) renamed, {len(leftovers)} temporary) "
                    f"deleted; resuming at {resume}"
                )
            tp.offset = OFFSET_BEGINNING if plan.next_offset is None else plan.next_offset
            self._expected[(tp.topic, tp.partition)] = plan.next_offset or 0
        consumer.assign(partitions)
        topics = len({tp.topic for tp in partitions})
        self._say(f"archiving {len(partitions)} partition(s) of {topics} topic(s)")

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:  # still ours until this returns: write out what we hold
            buffer = self._buffers.get((tp.topic, tp.partition))
            if buffer is not None:
                self._flush(buffer)
        self._written()  # its next owner resumes after the files it finds
        self._commit_hints()
        for tp in partitions:
            self._expected.pop((tp.topic, tp.partition), None)
        self._forget_heard(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Flushes of these partitions already queued are still written, as if the writer
        # had been quicker than the news of the loss (as a flush under way would be).
        for tp in partitions:  # another member may own them already: write nothing new
            dropped = self._buffers.pop((tp.topic, tp.partition), None)
            self._expected.pop((tp.topic, tp.partition), None)
            if dropped is not None:
                self._say(
                    f"{tp.topic} partition {tp.partition} was lost (session timeout); "
                    f"{dropped.records} buffered records will be archived by its new owner"
                )
        self._forget_heard(partitions)

    # -- records ----------------------------------------------------------------------------

    def _take_all(self, messages: list[Message]) -> None:
        """Buffer a batch of messages (the hot loop: kept free of per-message lookups)."""
        buffers, codec, events = self._buffers, self.codec, self._events
        heard = self._heard if self.settings.archive.audit else None
        now = time.monotonic()
        for message in messages:
            if message.error() is not None:
                self._kafka_error(message)
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if topic is None or partition is None or offset is None:
                continue
            key = (topic, partition)
            buffer = buffers.get(key)
            if buffer is None:
                buffer = self._new_buffer(key, offset)
            elif buffer.last is not None and offset <= buffer.last:
                continue  # delivered again after a seek: already buffered
            table = buffer.table
            value = message.value()
            rows, run, stamp_ms = table.rows(
                codec,
                message.key(),
                value,
                partition,
                offset,
                message.timestamp(),
                _headers(message) if table.record is None or table.host_clock else None,
            )
            buffer.add(rows, run, offset, len(value) if value else 0, stamp_ms)
            if not isinstance(rows, list):  # a batch of log records
                continue
            if "decode_error" in rows[0]:
                self.counts.undecodable += 1
            elif topic == events and run is not None and heard is not None:
                if rows[0].get("kind") == "run_end":
                    heard.pop(run, None)
                    self._schedule_audit(run)
                else:
                    heard[run] = (now, partition)

    def _kafka_error(self, message: Message) -> None:
        error = message.error()
        if error is None or error.code() == KafkaError._PARTITION_EOF:
            return
        if is_fatal(error):
            # The consumer is dead for good (e.g. fenced: another archiver has this
            # instance_id) and another member may own the partitions: write nothing, exit.
            # (Flushes already queued are written, as the writer may have been that quick.)
            self._buffers.clear()
            raise ArchiveError(
                f"archiver: fatal Kafka error: {error.str()} (two archivers with one "
                "archive.instance_id fence each other); restarted, an archiver resumes after "
                "its last complete flush"
            )
        self._warn(str(error.code()), "archiver: Kafka error %s", error.str())

    def _new_buffer(self, key: tuple[str, int], offset: int) -> PartitionBuffer:
        topic, partition = key
        expected = self._expected.get(key)
        if expected is not None and offset > expected:
            self._say(
                f"{topic} partition {partition}: offsets {expected}..{offset - 1} are no "
                "longer in Kafka (its retention deleted them before they were archived)"
            )
        buffer = PartitionBuffer(self._by_topic[topic], partition, time.monotonic())
        self._buffers[key] = buffer
        return buffer

    def _schedule_audit(self, run_id: str) -> None:
        archive = self.settings.archive
        if archive.audit and run_id not in self._audits:
            self._audits[run_id] = _PendingAudit(run_id, time.monotonic() + archive.audit_delay_s)

    def _roll(self, now: float) -> None:
        archive = self.settings.archive
        for buffer in list(self._buffers.values()):
            if buffer.bytes >= archive.roll_bytes or now - buffer.started >= archive.roll_s:
                self._flush(buffer)

    def _flush(self, buffer: PartitionBuffer) -> None:
        """Hand one buffer to the writer thread as one flush; blocks while it is behind."""
        assert self._writer is not None, "flushes are written while run() runs"
        key = (buffer.table.topic, buffer.partition)
        del self._buffers[key]
        if buffer.last is None:
            return
        self._expected[key] = buffer.last + 1
        self._writer.submit(functools.partial(self._write, buffer, buffer.last))

    def _write(self, buffer: PartitionBuffer, last: int) -> None:
        """Write one buffer as one flush (see the module docstring); then queue its hint.

        Runs on the writer thread, which alone touches ``buffer`` once it is handed over.
        """
        planned = buffer.flush_plan()
        compression = self.settings.archive.compression
        staged = [self.store.stage(file.relative, file.table, compression) for file in planned]
        self.store.commit(staged)
        self.counts.records += buffer.records
        self.counts.flushes += 1
        self.counts.files += len(planned)
        self._hints.append((buffer.table.topic, buffer.partition, last + 1))

    def _commit_hints(self) -> None:
        """Commit the offset hints of the flushes written since, for partitions still ours.

        Only the consuming thread calls the consumer: confluent-kafka serializes the calls
        to a consumer, so a commit from the writer thread would wait for ``consume()`` to
        return (and for ever while a rebalance callback waits for the writer).
        """
        newest: dict[tuple[str, int], int] = {}
        while self._hints:  # the writer appends meanwhile: a deque is safe for that
            topic, partition, offset = self._hints.popleft()
            newest[(topic, partition)] = offset  # flushes are written in order
        hints = [
            TopicPartition(topic, partition, offset)
            for (topic, partition), offset in newest.items()
            if (topic, partition) in self._expected  # not a partition lost meanwhile
        ]
        if self._consumer is None or not hints:
            return
        try:
            self._consumer.commit(offsets=hints, asynchronous=True)
        except Exception as exc:  # a hint only: the files are the truth
            self._warn("commit", "archiver: could not commit the offset hint: %s", exc)

    def _written(self) -> None:
        """Wait until every flush handed to the writer is on disk; raise if one failed."""
        if self._writer is not None:
            self._writer.wait()

    def _flush_all(self, topics: tuple[str, ...] | None = None) -> None:
        for buffer in list(self._buffers.values()):
            if topics is None or buffer.table.topic in topics:
                self._flush(buffer)

    # -- retention --------------------------------------------------------------------------

    def _prune_if_due(self, now: float) -> None:
        if now < self._next_prune:
            return
        self._next_prune = now + self.settings.archive.prune_interval_s
        cutoff = cutoff_ms(round(self._clock() * 1000), self.settings.archive.retention_days)
        result = prune(self.store, [table.topic for table in self.tables.values()], cutoff)
        self.counts.pruned += len(result.deleted)
        if result.deleted:
            self._say(f"retention: deleted {len(result.deleted)} archive file(s)")

    # -- audits -----------------------------------------------------------------------------

    def _audit_silent(self, now: float) -> None:
        """Schedule an audit of each run silent for ``audit_silent_after_s`` (no run_end)."""
        if now < self._next_silence_check or not self._heard:
            return
        self._next_silence_check = now + SILENCE_CHECK_S
        silent_after = self.settings.archive.audit_silent_after_s
        for run_id, (heard, _partition) in list(self._heard.items()):
            if now - heard >= silent_after and run_id not in self._audits:
                self._audits[run_id] = _PendingAudit(run_id, now, silent_s=now - heard)

    def _forget_heard(self, partitions: list[TopicPartition]) -> None:
        """Stop watching the silence of the runs in events partitions no longer ours."""
        gone = {tp.partition for tp in partitions if tp.topic == self._events}
        if gone:
            for run_id, (_heard, partition) in list(self._heard.items()):
                if partition in gone:
                    del self._heard[run_id]

    def _audit_if_due(self, now: float) -> None:
        for run_id, pending in list(self._audits.items()):
            if now < pending.due:
                continue
            watched = self._watched
            if pending.targets is None:
                pending.targets = self._end_offsets(watched)
                pending.targets_at = now
                pending.deadline = now + self.settings.archive.audit_wait_s
            self._flush_all(watched)
            self._written()
            behind = self._behind(pending.targets)
            if behind and now < pending.deadline:
                pending.due = now + AUDIT_RECHECK_S
                continue
            del self._audits[run_id]
            heard = self._heard.get(run_id)
            if heard is not None and heard[0] <= pending.targets_at:
                del self._heard[run_id]  # all it sent is in this audit: silent from now on
            self._audit(run_id, behind, pending.silent_s)

    def _end_offsets(self, topics: tuple[str, ...]) -> dict[tuple[str, int], int]:
        assert self._consumer is not None
        targets = {}
        for topic in topics:
            metadata = self._consumer.list_topics(topic, timeout=WATERMARK_TIMEOUT_S)
            for partition in metadata.topics[topic].partitions:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=WATERMARK_TIMEOUT_S, cached=False
                )
                targets[(topic, partition)] = high
        return targets

    def _behind(self, targets: dict[tuple[str, int], int]) -> list[str]:
        archived: dict[tuple[str, int], int] = {}
        for topic in {topic for topic, _ in targets}:
            files = self.store.files(topic)
            for _topic, partition in [key for key in targets if key[0] == topic]:
                archived[(topic, partition)] = plan_resume(files, partition).next_offset or 0
        return [
            f"{topic} partition {partition} ({archived[(topic, partition)]} of {target})"
            for (topic, partition), target in sorted(targets.items())
            if archived[(topic, partition)] < target
        ]

    def _audit(self, run_id: str, behind: list[str], silent_s: float | None) -> None:
        con = open_archive(
            self.settings.archive_root, self.topics, self.codec, self.settings.archive
        )
        try:
            (audit,) = audit_runs(con, run_id)
        finally:
            con.close()
        report = audit.report
        if silent_s is not None:
            report["summary"] += (
                f" The run sent no run_end: audited after {silent_s:.0f} s without an event."
            )
            self.counts.silent_audits += 1
        if behind:
            report["summary"] += " The archive had not caught up with " + ", ".join(behind) + "."
        producer = new_producer(self.settings, "archiver audits")
        producer.produce(
            self.topics.audits, self.codec.encode("AuditReport", report), run_id.encode()
        )
        left = producer.flush(WATERMARK_TIMEOUT_S)
        self.counts.audits += 1
        self._say(
            ("audit: " if report["ok"] else "audit FAILED: ")
            + report["summary"]
            + (" (not published: Kafka did not take it)" if left else "")
        )


def _headers(message: Message) -> list[tuple[str, bytes | str | None]]:
    found = message.headers()
    if found is None:
        return []
    return list(found.items()) if isinstance(found, dict) else list(found)
