"""The worker's faust application: the I/O shell around the step joiner and the rule engine.

Every worker runs one agent in one consumer group, so Kafka hands whole runs (partitions)
to workers and moves them, with their table state, when workers come and go. The agent
reads ``<prefix>.events``, ``<prefix>.ticks`` and ``<prefix>.acks`` (the trainers' acks,
co-partitioned with the events: they feed the checks of rules that ``expect`` an effect,
whose verdicts go to ``<prefix>.verdicts``; see :mod:`rlpulse.rules.verdicts`). Events go into
:class:`~rlpulse.streams.joiner.StepJoiner`; ticks (one per partition per
``tick_interval_s``, sent by every worker's timer) close the groups whose grace period ran
out. Ticks travel through Kafka so that the timer's table writes happen inside the stream,
on the partition that owns the state. Both go into
:class:`~rlpulse.streams.pipeline.StepPipeline` (the step joiner and the rule engine, the
same pure objects the backtest drives); each summary it releases goes to ``<prefix>.steps``
and the commands the rules issue for it to ``<prefix>.control``.

The rules are evaluated where the summaries are made, not by a second agent reading
``<prefix>.steps``: faust delivers all of a worker's topics through one fetcher that waits
whenever an agent's buffer is full, so a second agent starved behind a backlog of events
(its partitions stalled for seconds while the joiner caught up) and commands came late
exactly when a run was busiest. Rule state lives in a table partitioned like the events.

With ``security.control_signing_key`` set, every command is signed before it is sent
(:mod:`rlpulse.schemas.signing`), so that trainers holding the key accept it.

Input that cannot be used -- bytes that do not decode, events the joiner refuses, events
beyond the size limits, even an event or a summary that trips a bug -- goes to
``<prefix>.dlq`` with its key and bytes, a reason header and a source header, and is
counted; the agent carries on with the next message.

Speed. The agent joins each event as it is taken. The summaries it releases are sent
together at the end of the batch, except that a summary carrying commands is sent at once
(with those held before it, in order), so a command leaves as soon as the step's last rank
has been joined. Awaiting the deliveries and writing the state is done per batch (what
is buffered when the agent is ready, at most ``batch_max`` messages, open at most
``batch_window_s``: see :class:`Batcher`; a batch's cost beyond its events is a few awaited
produce round trips, so batches keep the worker's capacity without adding to a command's
latency). The tables are written through
:class:`~rlpulse.streams.worker.write_behind.WriteBehind`: each changed record goes to its
changelog once per batch instead of once per event. Everything it publishes goes through
:class:`~rlpulse.streams.worker.outbox.Outbox`, which hands it to faust's producer without yielding
to the event loop per record, so a batch's records leave in a few produce requests.

Crash safety: after any crash or rebalance no summary or command is lost and none is
applied twice. Around a rebalance faust was seen leaving a range of a partition out:
:class:`~rlpulse.streams.worker.read_tracker.ReadTracker` notices the gap and the agent reads
the range itself (:mod:`~rlpulse.streams.worker.gap_reader`) before the message that revealed
it, acking it with its batch; a tick watchdog re-seeks a partition whose delivery stalls.
Summaries and commands have deterministic ids and their consumers count each id once
(the rule engine evaluates a step once; the trainer's ControlClient applies a command
once), so publishing one twice is harmless; what must never happen is a state record
saying "published" or "evaluated" for something that was not. Each batch therefore ends
with, in this order: (1) the summaries, commands and dead letters it produced, awaited until
delivered; then the tables in :attr:`WorkerApp.commit_order` (the one place that order is
written), tier by tier: (2) the rule state, awaited; (3) the joiner's released groups, run
index and partition index, awaited; (4) the joiner's stage records. faust acks a batch's messages
after that and commits offsets only after flushing its producer, so a committed offset
implies (1)-(4) are durable. After a crash the new owner restores the tables from their
changelogs and replays the messages after the committed offset: whatever prefix of (1)-(4)
had landed, the joiner (see its module docstring) recomputes the same summaries with the
same ids, and every summary it does not release again (a released group it adopts from
(3)) was evaluated in a rule state that (2) made durable first; the rule engine skips the
steps that state has evaluated, and everything a restored record calls published was
delivered before that record was written.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import faust
from faust.types import TP
from prometheus_client import CollectorRegistry

from rlpulse.schemas.codec import Codec, default_codec
from rlpulse.schemas.exceptions import DecodeError
from rlpulse.schemas.records import READING_STAGES, ActionVerdict, ControlCommand
from rlpulse.schemas.signing import sign
from rlpulse.schemas.topics import REASON_HEADER, SOURCE_HEADER, Topics
from rlpulse.schemas.validation import size_problem
from rlpulse.settings import Settings
from rlpulse.streams.keys import event_stage_key, run_key
from rlpulse.streams.pipeline import PipelineTables, Released, StepOutput, StepPipeline
from rlpulse.streams.rulebook import RuleBook
from rlpulse.streams.worker.faust_consumer import use_faust_consumer
from rlpulse.streams.worker.gap_reader import GapReader
from rlpulse.streams.worker.json_values import JsonValues
from rlpulse.streams.worker.metrics import WorkerMetrics
from rlpulse.streams.worker.outbox import Outbox
from rlpulse.streams.worker.read_tracker import ReadTracker
from rlpulse.streams.worker.state_codec import register_state_codec
from rlpulse.streams.worker.write_behind import SourcePartition, WriteBehind, flush_in_order
from rlpulse.transport.clients import faust_broker_options, worker_client_id
from rlpulse.transport.replication import Replication
from rlpulse.transport.topics import TopicSpec

__all__ = ["EXIT_PUBLISH_FAILED", "WorkerApp", "fail_fast", "faust_app"]

log = logging.getLogger(__name__)


def faust_app(
    settings: Settings,
    replication: Replication | None = None,
    before_wait_empty: Callable[[], Awaitable[None]] | None = None,
) -> faust.App:
    """The faust app of a worker (or of a benchmark agent beside it), without agents.

    ``before_wait_empty`` is awaited before faust waits for every delivered event to be
    acked (at a rebalance and at stop): :meth:`Batcher.close_open`.

    Its data directory (and the parents of it) is created here: faust makes only the last
    level, and a fresh machine has none of them. The topics faust creates (changelogs, its
    assignor's) get ``replication``'s factor (faust's default, 1, without one).
    """
    worker = settings.worker
    data_dir = settings.worker_data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {
        **faust_broker_options(settings),
        "stream_buffer_maxsize": worker.buffer_max,
        "broker_commit_every": worker.commit_every,
        "broker_commit_interval": worker.commit_interval_s,
        "stream_processing_timeout": worker.stall_after_s,
        "producer_request_timeout": worker.publish_timeout_s,
        "datadir": str(data_dir),
        "store": "memory://",
        "key_serializer": "raw",
        "value_serializer": "raw",
        "topic_partitions": worker.partitions,
        "topic_allow_declare": True,
        "autodiscover": False,
        # Names this process among the group's members (rlpulse.local.group_probe looks for it).
        "broker_client_id": worker_client_id(os.getpid()),
        "web_enabled": worker.web_port > 0,
        "web_host": "127.0.0.1",
        "web_port": worker.web_port or 6066,
        # A killed worker's partitions move to the others after this long.
        "broker_session_timeout": 10.0,
        "broker_heartbeat_interval": 1.0,
        # A batch's writes to one partition leave in one produce batch.
        "producer_max_batch_size": 256 * 1024,
        # A stage's unreleased steps are one state record: ranks x metrics x open steps.
        "producer_max_request_size": worker.state_max_bytes + STATE_RECORD_MARGIN,
        "consumer_max_fetch_size": worker.state_max_bytes + STATE_RECORD_MARGIN,
    }
    if replication is not None:
        options["topic_replication_factor"] = replication.factor
    app = faust.App(settings.worker_group, **options)
    use_faust_consumer(
        app,
        fetch_max_wait_s=worker.fetch_max_wait_s,
        pause_on_busy_buffer=worker.pause_on_busy_buffer,
        before_wait_empty=before_wait_empty,
    )
    return app


STATE_RECORD_MARGIN = 64 * 1024
"""Room for a record's key, headers and batch framing above ``worker.state_max_bytes``."""

EXIT_PUBLISH_FAILED = 75
"""The worker's exit status when a write failed (``EX_TEMPFAIL``: a supervisor restarts it)."""


def fail_fast(exc: BaseException) -> NoReturn:
    """End the process at once after a failed publish, state write or re-read; never returns.

    faust would restart the agent inside the process, whose tables and write-behind are then
    ahead of what was published; a new process recovers from the changelogs instead, the path
    the crash-order argument of docs/design.md covers (as after a SIGKILL).
    """
    log.critical(
        "a summary, command or state write, or a re-read of skipped offsets, failed (%s: %s); "
        "the worker exits with status %d so that its restart recovers from the changelogs",
        type(exc).__name__,
        exc,
        EXIT_PUBLISH_FAILED,
    )
    logging.shutdown()
    os._exit(EXIT_PUBLISH_FAILED)


class Batcher:
    """Takes a stream's events in batches, and finishes an open batch when a rebalance asks.

    A batch closes when the buffer stays empty for ``batch_linger_s``, at ``batch_max``
    events, or ``batch_window_s`` after its first event. The window bounds how long a
    batch stays open: under a steady load that arrives faster than the linger, a batch would
    otherwise stay open until ``batch_max`` (2,000 events, half a second at 4,000 events/s).
    ``each`` is awaited with every event as it is taken, so the work on an event need not
    wait for its batch to close; ``finish`` once per batch, after which its events are acked
    (their offsets become committable).

    Before faust revokes partitions or stops, it stops delivering events and waits until
    every event handed to an agent is acked. A batch left open then (events taken, the
    buffer not yet empty when faust stopped it) would wait for a next event that does not
    come, and faust would wait for it forever: the group's rebalance hung, and a SIGTERMed
    worker never ended. :meth:`close_open`, which the consumer awaits before that wait
    (:func:`~rlpulse.streams.worker.faust_consumer.use_faust_consumer`), finishes and acks
    the open batch there.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings.worker
        self._lock = asyncio.Lock()
        self._open: list[Any] = []
        self._waiting = False
        self._finish: Callable[[], Awaitable[None]] | None = None
        self._ack: Callable[[Any], Awaitable[None]] | None = None

    async def run(
        self,
        stream: Any,
        finish: Callable[[], Awaitable[None]],
        each: Callable[[Any], Awaitable[None]] | None = None,
    ) -> None:
        """The agent's loop over ``stream`` (returns when the stream ends)."""
        manual = stream.noack()
        queue = manual.channel.queue
        clock = asyncio.get_running_loop().time
        self._finish, self._ack = finish, manual.ack
        batch_max, window_s = self._settings.batch_max, self._settings.batch_window_s
        opened = 0.0
        self._waiting = True
        async for event in manual.events():
            self._waiting = False
            async with self._lock:
                if not self._open:
                    opened = clock()
                self._open.append(event)
                if each is not None:
                    await each(event)
                full = len(self._open) >= batch_max or clock() - opened >= window_s
                if not full and queue.empty():
                    await asyncio.sleep(self._settings.batch_linger_s)
                if full or queue.empty():
                    await self._close()
            self._waiting = True

    async def close_open(self) -> None:
        """Finish and ack the open batch while the agent waits for an event that won't come.

        While the agent works on an event it closes its batch itself (faust has emptied the
        buffer, so the batch closes after this event); waiting for it here could deadlock
        with a rebalance the agent's own work waits for (a seek, a commit).
        """
        if not self._waiting:
            return
        async with self._lock:
            if self._open:
                await self._close()

    async def _close(self) -> None:
        batch, self._open = self._open, []
        assert self._finish is not None and self._ack is not None
        await self._finish()
        for done in batch:
            await self._ack(done)


class WorkerApp:
    """One worker process's faust app, its tables and its agent."""

    def __init__(
        self,
        settings: Settings,
        book: RuleBook,
        registry: CollectorRegistry | None = None,
        codec: Codec | None = None,
        replication: Replication | None = None,
    ) -> None:
        self.settings = settings
        self.codec = codec or default_codec()
        self.signing_key = settings.security.signing_key()
        """The key the commands this worker issues are signed with (None: unsigned)."""
        self.metrics = WorkerMetrics(registry if registry is not None else CollectorRegistry())
        self.book = book
        book.on_outcome = lambda outcome: self.metrics.rules_updates.labels(outcome).inc()
        book.on_refusal = lambda reason: self.metrics.rules_refused.labels(reason).inc()
        self.batcher = Batcher(settings)
        self.app = faust_app(settings, replication, before_wait_empty=self.batcher.close_open)
        changelog_config = {} if replication is None else replication.topic_config()
        self.outbox = Outbox(self.app)
        state_codec = register_state_codec()
        self.source = SourcePartition()
        topics = Topics(settings.prefix)

        def table(name: str, encoded_values: bool = False) -> WriteBehind:
            created: Any = self.app.Table(
                name, partitions=settings.worker.partitions, extra_topic_configs=changelog_config
            )
            # faust derives serializers from key_type/value_type; ours are plain JSON documents
            # (or those documents already encoded, see JsonValues). The changelog topic was made
            # with faust's json codec, which (with orjson installed) cannot read back the NaN
            # the state holds: it is replaced by one with the same serializers as the table.
            created.key_serializer = state_codec
            created.value_serializer = "raw" if encoded_values else state_codec
            created.changelog_topic = created.changelog_topic.derive(
                key_serializer=created.key_serializer, value_serializer=created.value_serializer
            )
            return WriteBehind(created, self.outbox, self.source)

        self.topics = topics
        self.ticks_name = topics.ticks
        self.events_name = topics.events
        self.steps_name = topics.steps
        self.acks_name = topics.acks

        self.groups = table("joiner-groups", encoded_values=True)
        self.stages = table("joiner-stages")
        self.runs = table("joiner-runs")
        self.partition_stages = table("joiner-partition-stages")
        self.rule_state = table("rule-state")
        self.pipeline = StepPipeline(
            PipelineTables(JsonValues(self.groups), self.stages, self.runs, self.rule_state),
            lambda: book.engine,
            settings.worker,
            settings.limits,
        )
        self.joiner = self.pipeline.joiner
        self.commit_order: tuple[tuple[WriteBehind, ...], ...] = (
            (self.rule_state,),
            (self.groups, self.runs, self.partition_stages),
            (self.stages,),
        )
        """The tables a batch makes durable after its outputs are delivered, tier by tier,
        each tier delivered before the next is sent: (2), (3), (4) of the module docstring."""
        self._tables = tuple(view for tier in self.commit_order for view in tier)
        # Stage keys this process has put in (or found in) its partition's index.
        self._indexed_stages: set[str] = set()
        # Run attempt keys this process has put in its partition's index of watched runs
        # (silence rules; under "r<partition>" in the same table).
        self._indexed_runs: set[str] = set()
        # Partitions taken over since the last rebalance; what was read of each events
        # partition, and the stall watchdog's counts.
        self._owned: set[int] = set()
        self.reads = ReadTracker(min_tick_gap_s=0.9 * settings.worker.tick_interval_s)
        self.gaps = GapReader(settings, settings.worker_group)
        # The batch in progress: deliveries to await, released summaries not yet sent.
        self._deliveries: list[Awaitable[Any]] = []
        self._held: list[tuple[Released, Any]] = []
        # Messages faust skipped and the agent read itself: acked when their batch ends.
        self._reread: list[Any] = []

        self.app.agent(
            self.app.topic(topics.events, topics.ticks, topics.acks), name="rlpulse.joiner"
        )(self._join_agent)
        self.app.timer(settings.worker.tick_interval_s, name="rlpulse.ticks")(self._send_ticks)
        self.app.on_partitions_revoked.connect(self._on_revoked)

    def faust_topics(self) -> dict[str, TopicSpec]:
        """The topics faust would create at start: each table's changelog, its assignor's.

        The worker creates them first (:func:`~rlpulse.transport.topics.create_missing`) and
        waits for their leaders: a topic faust creates itself is subscribed to before the
        broker's metadata shows it, and aiokafka logs an ERROR for it.
        """
        changelogs = {
            view.table.changelog_topic.get_topic_name(): TopicSpec(
                self.settings.worker.partitions,
                {
                    "cleanup.policy": "compact",
                    "max.message.bytes": str(
                        self.settings.worker.state_max_bytes + STATE_RECORD_MARGIN
                    ),
                },
            )
            for view in self._tables
        }
        leader = f"{self.app.conf.id}-__assignor-__leader"
        return {**changelogs, leader: TopicSpec(1, {})}

    # -- joiner ---------------------------------------------------------------------------

    async def _join_agent(self, stream: Any) -> None:
        async def join(event: Any) -> None:
            try:
                await self._join_one(event.message)
            except Exception as exc:  # a failed send ends the process (fail_fast)
                fail_fast(exc)

        async def finish() -> None:
            try:
                await self._finish_batch()
            except Exception as exc:  # a failed send or write ends the process (fail_fast)
                fail_fast(exc)

        await self.batcher.run(stream, finish, join)

    async def _join_one(self, message: Any) -> None:
        """Join one message (an event or a tick); send what it released if a command is due.

        Released summaries are held back and sent together at the end of the batch (a few
        produce requests for all of them), except when one carries commands: then the held
        ones and it are sent at once, in their order, so the command does not wait for the
        batch to close.
        """
        self.source.number = message.partition
        if message.partition not in self._owned:
            self._take_over(message.partition)
        if message.topic == self.ticks_name:
            if not await self._may_expire(message.partition):
                self.metrics.ticks_deferred.inc()
                return
            output = self._on_tick(message.partition)
            await self._hold(output.released, message)
            if output.silences:
                await self._send_held()
                for command in output.silences:
                    self._deliveries.append(await self._send_command(command))
            return
        for each in await self._in_order(message):
            if each.topic == self.acks_name:
                await self._on_ack(each)
            else:
                await self._hold(await self._on_event(each, self._deliveries), each)

    async def _hold(self, released: list[Released], source: Any) -> None:
        for item in released:
            self._held.append((item, source))
            if item.commands:
                await self._send_held()

    async def _send_held(self) -> None:
        for item, source in self._held:
            self._deliveries += await self._publish(item, source)
        self._held.clear()

    async def _finish_batch(self) -> None:
        """Send what is held, await the batch's sends, then write its state, in that order."""
        await self._send_held()
        await asyncio.gather(*self._deliveries)
        self._deliveries.clear()
        await flush_in_order(*self.commit_order)
        for message in self._reread:  # their offsets become committable with the batch's
            self.app.consumer.ack(message)
        self._reread.clear()

    async def _on_event(self, message: Any, deliveries: list[Awaitable[Any]]) -> list[Released]:
        """Join one event; a refused one is dead-lettered (its delivery added to ``deliveries``)."""
        self.metrics.events.inc()
        data: bytes = message.value or b""
        too_large = size_problem(len(data), self.settings.limits)
        if too_large is not None:
            deliveries.append(await self._dead_letter(message, str(too_large)))
            return []
        try:
            record = self.codec.decode_event(data)
        except DecodeError as exc:
            deliveries.append(await self._dead_letter(message, f"undecodable: {exc}"))
            return []
        try:
            output = self.pipeline.add(record, time.time_ns())
            if output.rejected is None and record["kind"] in ("metrics", "log"):
                self._index_stage(message.partition, event_stage_key(record))
                if record["stage"] not in READING_STAGES:
                    self._index_run(message.partition, run_key(record["run_id"], record["attempt"]))
        except Exception as exc:  # a bug must not stop the worker: keep the event for a fix
            log.exception("joiner failed on %s", _source(message))
            deliveries.append(await self._dead_letter(message, f"error: {exc!r}"))
            return []
        if output.duplicate:
            self.metrics.duplicates.inc()
        if output.rejected is not None:
            deliveries.append(await self._dead_letter(message, output.rejected))
        deliveries += await self._send_verdicts(output.ended)
        return output.released

    async def _on_ack(self, message: Any) -> None:
        """Take a trainer's ack: the verdict it decides is sent at once."""
        try:
            ack = self.codec.decode_ack(message.value or b"")
        except DecodeError as exc:
            self._deliveries.append(await self._dead_letter(message, f"undecodable: {exc}"))
            return
        try:
            output = self.pipeline.acknowledge(ack, time.time_ns())
        except Exception as exc:  # a bug must not stop the worker: keep the ack for a fix
            log.exception("verdict check failed on %s", _source(message))
            self._deliveries.append(await self._dead_letter(message, f"error: {exc!r}"))
            return
        self._deliveries += await self._send_verdicts(output.ended)

    async def _send_verdicts(self, verdicts: list[ActionVerdict]) -> list[Awaitable[Any]]:
        deliveries: list[Awaitable[Any]] = []
        for verdict in verdicts:
            self.metrics.verdicts.labels(verdict["rule_id"], verdict["verdict"]).inc()
            encoded = self.codec.encode("ActionVerdict", verdict)
            key = verdict["run_id"].encode()
            deliveries.append(await self.outbox.send(self.topics.verdicts, key, encoded))
        return deliveries

    async def _in_order(self, message: Any) -> list[Any]:
        """``message``, after the offsets of its partition faust left out before it, read here.

        A message delivered again (after a seek) is processed again: the joiner drops events
        it has merged (by producer id and seq) and the rule engine evaluates each step once.
        """
        if self.reads.next_offset(message.tp) is None:  # faust may learn it after the takeover
            self._expect_committed(message.tp)
        missing = self.reads.delivered(message.tp, message.offset)
        if not missing:
            return [message]
        read = await self.gaps.read(message.topic, message.partition, missing.start, missing.stop)
        log.warning(
            "%s partition %d: offsets %d..%d were never delivered; read them again (%d messages)",
            message.topic,
            message.partition,
            missing.start,
            missing.stop - 1,
            len(read),
        )
        self.metrics.rewinds.inc()
        self._reread += read
        return [*read, message]

    def _take_over(self, partition: int) -> None:
        """Start owning ``partition``: its open groups get a fresh grace period.

        Its events are expected from the committed offset on: the first ones delivered after
        a restart may skip some (the faust behaviour :mod:`.read_tracker` describes), and a
        skipped event of an open step would leave that step to close by grace without it.
        """
        self._owned.add(partition)
        self._expect_committed(TP(self.events_name, partition))
        stage_keys = list(self.partition_stages.get(f"p{partition}") or [])
        reset = self.joiner.restart_grace(stage_keys, time.time_ns())
        if log.isEnabledFor(logging.INFO):
            frontiers = {k: self.stages[k]["frontier"] for k in stage_keys if k in self.stages}
            log.info(
                "took over partition %d: reading events from offset %s; %d open steps; "
                "emitted up to %s",
                partition,
                self._unread(partition)[0],
                reset,
                frontiers,
            )

    def _unread(self, partition: int) -> tuple[int | None, int]:
        """The next events offset this worker wants from a partition, and how many lie beyond."""
        tp = TP(self.events_name, partition)
        wanted = self.reads.next_offset(tp)
        if wanted is None:  # nothing read since the takeover: it reads from the committed offset
            wanted = self._committed(tp)
        end = self.app.consumer.highwater(tp)
        if end is None or wanted is None:
            return wanted, 0
        return wanted, max(end - wanted, 0)

    def _expect_committed(self, tp: TP) -> None:
        committed = self._committed(tp)
        if committed is not None:
            self.reads.expect(tp, committed)

    def _committed(self, tp: TP) -> int | None:
        """The consumer's committed offset of ``tp`` (the next one to read), if it has one."""
        committed = getattr(self.app.consumer, "_committed_offset", {}).get(tp)
        return committed if isinstance(committed, int) else None

    async def _progressing(self, partition: int) -> tuple[bool, int]:
        """Whether a partition's events delivery moved since the last tick; how much is unread.

        A watchdog for a faust behaviour seen after restarts: a partition whose delivery
        stops after a message or two while the consumer believes it has read further. When a
        partition with unread messages has delivered nothing for ``stall_ticks`` ticks, the
        worker seeks it back to the offset it wants.
        """
        tp = TP(self.events_name, partition)
        wanted, unread = self._unread(partition)
        ticks = self.reads.stalled_ticks(tp, wanted, unread, time.monotonic())
        if wanted is not None and ticks >= self.settings.worker.stall_ticks:
            log.warning(
                "events partition %d: nothing delivered past offset %d (%d unread) for %d ticks; "
                "seeking back to it",
                partition,
                wanted,
                unread,
                ticks,
            )
            self.metrics.rewinds.inc()
            self.reads.rewound(tp)
            await self.app.consumer.seek(tp, wanted)
        return ticks == 0, unread

    async def _may_expire(self, partition: int) -> bool:
        """Whether a tick may close ``partition``'s overdue steps; checks its events for a stall.

        Not while this worker is behind on the partition's events (more than
        ``caught_up_lag`` unread) or while their delivery makes no progress: the missing
        ranks' events may be in that backlog.
        """
        moving, unread = await self._progressing(partition)
        return moving and unread <= self.settings.worker.caught_up_lag

    def _on_tick(self, partition: int) -> StepOutput:
        key, runs_key = f"p{partition}", f"r{partition}"
        stage_keys: list[str] = list(self.partition_stages.get(key) or [])
        run_keys: list[str] = list(self.partition_stages.get(runs_key) or [])
        output = self.pipeline.expire(time.time_ns(), stage_keys, run_keys)
        alive = [k for k in stage_keys if k in self.stages]
        if len(alive) != len(stage_keys):
            self.partition_stages[key] = alive
            self._indexed_stages.difference_update(set(stage_keys) - set(alive))
        watched = [k for k in run_keys if _may_go_silent(self.rule_state.get(k))]
        if len(watched) != len(run_keys):
            self.partition_stages[runs_key] = watched
            self._indexed_runs.difference_update(set(run_keys) - set(watched))
        return output

    def _index_run(self, partition: int, rkey: str) -> None:
        """Remember which partition holds a run attempt, so its ticks watch it for silence."""
        self._index(f"r{partition}", rkey, self._indexed_runs)

    def _index_stage(self, partition: int, skey: str) -> None:
        """Remember which partition holds a stage, so that partition's ticks can expire it."""
        self._index(f"p{partition}", skey, self._indexed_stages)

    def _index(self, key: str, item: str, indexed: set[str]) -> None:
        """Add ``item`` to the partition index under ``key`` once; ``indexed`` remembers it."""
        if item in indexed:
            return
        known: list[str] = list(self.partition_stages.get(key) or [])
        if item not in known:
            self.partition_stages[key] = [*known, item]
        indexed.add(item)

    async def _publish(self, item: Released, source: Any) -> list[Awaitable[Any]]:
        """Send a released summary and its commands; returns their deliveries.

        A summary the rule engine failed on goes to the DLQ as well (naming ``source``, the
        message whose processing released it), so it can be evaluated once the bug is fixed.
        """
        summary = item.summary
        self.metrics.summaries.labels(summary["closed_by"]).inc()
        lag_s = (summary["emitted_ns"] - summary["first_event_ns"]) / 1e9
        self.metrics.join_lag.observe(max(lag_s, 0.0))
        key = summary["run_id"].encode()
        encoded = self.codec.encode("StepSummary", summary)
        deliveries: list[Awaitable[Any]] = [await self.outbox.send(self.steps_name, key, encoded)]
        if item.error is not None:
            log.error("rule engine failed on %s: %s", summary["summary_id"], item.error)
            reason = f"error: {item.error}"
            deliveries.append(await self._send_dead_letter(key, encoded, reason, _source(source)))
        for command in item.commands:
            deliveries.append(await self._send_command(command))
        return deliveries + await self._send_verdicts(item.verdicts)

    async def _send_command(self, command: ControlCommand) -> Awaitable[Any]:
        """Sign (where signing is on) and send one command; returns its delivery."""
        self.metrics.count_command(command["rule_id"], dry_run=command["dry_run"])
        signing_key = self.signing_key
        signed = command if signing_key is None else sign(command, signing_key, self.codec)
        return await self.outbox.send(
            self.topics.control,
            command["run_id"].encode(),
            self.codec.encode("ControlCommand", signed),
        )

    async def _send_ticks(self) -> None:
        for partition in range(self.settings.worker.partitions):
            await self.outbox.send(self.ticks_name, None, b"", partition)

    # -- shared ---------------------------------------------------------------------------

    async def _dead_letter(self, message: Any, reason: str) -> Awaitable[Any]:
        """Send the message's original key and bytes to the DLQ; ``reason`` starts with its kind."""
        return await self._send_dead_letter(message.key, message.value, reason, _source(message))

    async def _send_dead_letter(
        self, key: bytes | None, value: bytes | None, reason: str, source: str
    ) -> Awaitable[Any]:
        self.metrics.dead_letters.labels(reason.split(":", 1)[0]).inc()
        return await self.outbox.send(
            self.topics.dlq,
            key,
            value,
            headers=[
                (REASON_HEADER, reason.encode()[: self.settings.worker.max_reason_bytes]),
                (SOURCE_HEADER, source.encode()),
            ],
        )

    async def _on_revoked(self, sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        # The partition indexes (open stages, watched runs) are re-read from the table when a
        # partition comes back: another worker may have changed them meanwhile.
        self._indexed_stages.clear()
        self._indexed_runs.clear()
        self._owned.clear()
        self.reads.forget()


def _source(message: Any) -> str:
    return f"{message.topic}/{message.partition}/{message.offset}"


def _may_go_silent(state: Any) -> bool:
    """Whether a run attempt's rule state may still go silent (not stopped, not ended)."""
    return isinstance(state, dict) and state.get("stopped_by") is None and not state.get("ended")
