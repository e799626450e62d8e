"""The worker's faust application: the I/O shell around the step joiner and the rule engine.

Two agents share one consumer group, so Kafka hands whole runs (partitions) to
workers and moves them, with their table state, when workers come and go:

- the **joiner agent** reads ``<prefix>.events`` and ``<prefix>.ticks``. Events go
  into :class:`~rlpulse.streams.joiner.StepJoiner`; ticks (one per partition per
  ``tick_interval_s``, sent by every worker's timer) close the groups whose grace
  period ran out. Ticks travel through Kafka so that the timer's table writes happen
  inside the stream, on the partition that owns the state, as faust requires.
- the **rule agent** reads ``<prefix>.steps`` and feeds each summary to
  :class:`~rlpulse.rules.evaluator.RuleEngine`; commands go to ``<prefix>.control``.

All state lives in faust Tables backed by changelog topics. Summaries and commands
have deterministic ids and their consumers count each id once, so when a worker takes
over a partition (after a crash or a rebalance) it re-publishes what it had recently
published there: anything lost in flight is delivered, nothing is applied twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faust
from prometheus_client import CollectorRegistry

from rlpulse.rules.loader import load_preset, load_rules_source
from rlpulse.schemas.codec import Codec, default_codec
from rlpulse.schemas.exceptions import DecodeError
from rlpulse.schemas.records import ControlCommand, StepSummary, TrainerEvent
from rlpulse.streams.joiner import JoinerConfig, StepJoiner
from rlpulse.streams.metrics import WorkerMetrics
from rlpulse.streams.rulebook import RuleBook, RulesFileWatcher, RulesTopicFollower
from rlpulse.streams.settings import WorkerSettings
from rlpulse.streams.state_codec import register_state_codec

log = logging.getLogger(__name__)

REASON_HEADER = "rlpulse-reason"
SOURCE_HEADER = "rlpulse-source"


def stage_key(event: TrainerEvent) -> str:
    """The joiner's key for the (run, attempt, stage) of an event."""
    return f"{event['run_id']}|{event['attempt']}|{event['stage']}"


class WorkerApp:
    """One worker process's faust app, its tables and its two agents."""

    def __init__(
        self,
        settings: WorkerSettings,
        book: RuleBook,
        registry: CollectorRegistry | None = None,
        codec: Codec | None = None,
    ) -> None:
        self.settings = settings
        self.codec = codec or default_codec()
        self.metrics = WorkerMetrics(registry if registry is not None else CollectorRegistry())
        self.book = book
        book.on_outcome = lambda outcome: self.metrics.rules_updates.labels(outcome).inc()
        state_codec = register_state_codec()
        topics = settings.topics
        app_options: dict[str, Any] = {
            "broker": f"kafka://{settings.bootstrap_servers}",
            "store": "memory://",
            "key_serializer": "raw",
            "value_serializer": "raw",
            "topic_partitions": settings.partitions,
            "topic_allow_declare": True,
            "autodiscover": False,
            "web_enabled": settings.web_port > 0,
            "web_host": "127.0.0.1",
            "web_port": settings.web_port or 6066,
            # A killed worker's partitions move to the others after this long.
            "broker_session_timeout": 10.0,
            "broker_heartbeat_interval": 1.0,
        }
        if settings.data_dir is not None:
            app_options["datadir"] = settings.data_dir
        self.app = faust.App(settings.group_id, **app_options)

        def topic(name: str) -> Any:
            return self.app.topic(
                name,
                key_type=bytes,
                value_type=bytes,
                partitions=settings.partitions,
                internal=False,
            )

        def table(name: str) -> Any:
            created: Any = self.app.Table(name, partitions=settings.partitions)
            # faust derives serializers from key_type/value_type; ours are plain JSON documents.
            created.key_serializer = created.value_serializer = state_codec
            return created

        self.events_topic = topic(topics.events)
        self.ticks_topic = topic(topics.ticks)
        self.steps_topic = topic(topics.steps)
        self.control_topic = topic(topics.control)
        self.dlq_topic = self.app.topic(topics.dlq, key_type=bytes, value_type=bytes)
        self.ticks_name = topics.ticks

        self.groups = table("joiner-groups")
        self.stages = table("joiner-stages")
        self.runs = table("joiner-runs")
        self.partition_stages = table("joiner-partition-stages")
        self.rule_state = table("rule-state")
        self.issued = table("rule-issued")
        self.joiner = StepJoiner(
            self.groups,
            self.stages,
            self.runs,
            JoinerConfig(grace_s=settings.grace_s, late_window_s=settings.late_window_s),
        )
        # Partitions and run attempts this process re-published after taking them over.
        self._resent_partitions: set[int] = set()
        self._resent_runs: set[str] = set()
        self._indexed_stages: set[str] = set()

        self.app.agent(self.app.topic(topics.events, topics.ticks), name="rlpulse.joiner")(
            self._join_agent
        )
        self.app.agent(self.steps_topic, name="rlpulse.rules")(self._rule_agent)
        self.app.timer(settings.tick_interval_s, name="rlpulse.ticks")(self._send_ticks)
        self.app.on_partitions_revoked.connect(self._on_revoked)

    # -- joiner ---------------------------------------------------------------------------

    async def _join_agent(self, stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            if message.partition not in self._resent_partitions:
                await self._resend_partition(message.partition)
            if message.topic == self.ticks_name:
                await self._on_tick(message.partition)
            else:
                await self._on_event(message)

    async def _resend_partition(self, partition: int) -> None:
        """Re-publish the summaries a previous owner of ``partition`` may have lost in flight.

        Runs before this process handles the partition's first message, so the table
        holds exactly what earlier owners published; a fresh partition has nothing.
        """
        self._resent_partitions.add(partition)
        stage_keys = list(self.partition_stages.get(f"p{partition}") or [])
        for summary in self.joiner.recent_summaries(stage_keys, since_ns=0):
            self.metrics.resent.labels("summary").inc()
            await self._publish_summary(summary, count=False)

    async def _on_event(self, message: Any) -> None:
        self.metrics.events.inc()
        try:
            record = self.codec.decode_event(message.value or b"")
        except DecodeError as exc:
            await self._dead_letter(message, f"undecodable: {exc}", exc.failure.value)
            return
        self._index_stage(message.partition, record)
        outcome = self.joiner.add(record, time.time_ns())
        if outcome.duplicate:
            self.metrics.duplicates.inc()
        if outcome.rejected is not None:
            await self._dead_letter(message, outcome.rejected, outcome.rejected.split(":")[0])
        for summary in outcome.summaries:
            await self._publish_summary(summary)

    async def _on_tick(self, partition: int) -> None:
        key = f"p{partition}"
        stage_keys: list[str] = list(self.partition_stages.get(key) or [])
        for summary in self.joiner.expire(time.time_ns(), stage_keys):
            await self._publish_summary(summary)
        alive = [k for k in stage_keys if k in self.stages]
        if len(alive) != len(stage_keys):
            self.partition_stages[key] = alive
            self._indexed_stages.difference_update(set(stage_keys) - set(alive))

    def _index_stage(self, partition: int, record: TrainerEvent) -> None:
        """Remember which partition holds a stage, so that partition's ticks can expire it."""
        skey = stage_key(record)
        if skey in self._indexed_stages:
            return
        key = f"p{partition}"
        known: list[str] = list(self.partition_stages.get(key) or [])
        if skey not in known:
            known.append(skey)
            self.partition_stages[key] = known
        self._indexed_stages.add(skey)

    async def _publish_summary(self, summary: StepSummary, count: bool = True) -> None:
        if count:
            self.metrics.summaries.labels(summary["closed_by"]).inc()
            lag_s = (summary["emitted_ns"] - summary["first_event_ns"]) / 1e9
            self.metrics.join_lag.observe(max(lag_s, 0.0))
        await self.steps_topic.send(
            key=summary["run_id"].encode(),
            value=self.codec.encode("StepSummary", summary),
        )

    async def _send_ticks(self) -> None:
        for partition in range(self.settings.partitions):
            await self.ticks_topic.send(value=b"", partition=partition)

    # -- rules ----------------------------------------------------------------------------

    async def _rule_agent(self, stream: Any) -> None:
        async for event in stream.events():
            await self._on_summary(event.message)

    async def _on_summary(self, message: Any) -> None:
        try:
            summary = self.codec.decode_summary(message.value or b"")
        except DecodeError as exc:
            await self._dead_letter(message, f"undecodable: {exc}", exc.failure.value)
            return
        run_key = f"{summary['run_id']}|{summary['attempt']}"
        if run_key not in self._resent_runs:
            self._resent_runs.add(run_key)
            for command in self.issued.get(run_key) or []:
                self.metrics.resent.labels("command").inc()
                await self._publish_command(command)
        state, commands = self.book.engine.evaluate(
            self.rule_state.get(run_key), summary, time.time_ns()
        )
        self.rule_state[run_key] = state
        if not commands:
            return
        recent = list(self.issued.get(run_key) or []) + list(commands)
        self.issued[run_key] = (
            recent[-self.settings.recent_commands :] if self.settings.recent_commands else []
        )
        for command in commands:
            self.metrics.commands.labels(command["rule_id"] or "", str(command["dry_run"])).inc()
            await self._publish_command(command)

    async def _publish_command(self, command: ControlCommand) -> None:
        await self.control_topic.send(
            key=command["run_id"].encode(),
            value=self.codec.encode("ControlCommand", command),
        )

    # -- shared ---------------------------------------------------------------------------

    async def _dead_letter(self, message: Any, reason: str, kind: str) -> None:
        self.metrics.dead_letters.labels(kind).inc()
        source = f"{message.topic}/{message.partition}/{message.offset}"
        await self.dlq_topic.send(
            key=message.key,
            value=message.value,
            headers=[(REASON_HEADER, reason.encode()), (SOURCE_HEADER, source.encode())],
        )

    async def _on_revoked(self, sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        # Whoever gets these partitions next re-publishes; if it is us again, so do we.
        self._resent_partitions.clear()
        self._resent_runs.clear()
        self._indexed_stages.clear()


RULES_FROM_TOPIC = "topic"


def rules_book(settings: WorkerSettings, source: str) -> tuple[RuleBook, Callable[[], None]]:
    """The worker's rule book for ``--rules SOURCE``, and a function that starts following it.

    ``topic``: the rules published on ``<prefix>.rules`` (the seed preset until one is);
    a file: that file, reloaded when it changes and on SIGHUP; else a preset name.
    """
    if source == RULES_FROM_TOPIC:
        book = RuleBook(load_preset("seed"), "<preset seed, until rules are published>")
        follower = RulesTopicFollower(book, settings.bootstrap_servers, settings.topics.rules)

        def follow_topic() -> None:
            follower.start()
            if not follower.wait_caught_up(timeout_s=15.0):
                log.warning(
                    "rules topic not read to its end in 15 s; starting with %s", book.origin
                )

        return book, follow_topic
    book = RuleBook(load_rules_source(source), source)
    path = Path(source)
    if not path.exists():
        return book, lambda: None
    return book, RulesFileWatcher(book, path).start


def run_worker(settings: WorkerSettings, rules_source: str, loglevel: str = "warning") -> None:
    """Create the topics if needed and run a worker until SIGTERM or SIGINT."""
    from rlpulse.kafka_admin import ensure_topics

    ensure_topics(settings.bootstrap_servers, settings.topics, settings.partitions)
    book, follow = rules_book(settings, rules_source)
    follow()
    registry = CollectorRegistry()
    worker_app = WorkerApp(settings, book, registry=registry)
    if settings.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port, addr="127.0.0.1", registry=registry)
    worker = faust.Worker(worker_app.app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
