"""Trainer-side faults against a real broker this module starts, stops and restarts.

(a) the broker is down when training starts and comes up 20 s later; (b) it is stopped
for 30 s mid-run; (d) a rank logging events and records from two threads is SIGKILLed
mid-run, or during an outage, and its run never comes back to the host. In (a) and (b) every
event reaches the events topic exactly once, and nothing else does; a real worker, started
on the result, summarises every step with every rank once and publishes each summary once. In
(d) every record ``log()`` accepted is on its topic exactly once, sent by the host's agent
alone, and in the archive once (the audit finds no gap and no duplicate).

The broker keeps one fixed port so that clients reconnect to the same address after a
restart. The host's agent's deliveries fail after ``DELIVERY_TIMEOUT_S`` (below the outage);
the records wait in the write-ahead log, and when the broker answers again the agent reads
the topic back and sends the rest, so both librdkafka's own retries and the resend from the
log run in (a), (b) and (d).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from rlpulse.archive.catalog import query_archive
from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.local.broker import LocalBroker
from rlpulse.local.child_process import free_port
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import EventLogger, Settings
from rlpulse.producers.delivery.wal import logs_under
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import LogRecord, StepSummary, TrainerEvent
from rlpulse.schemas.topics import Topics
from rlpulse.settings import ProducerSettings
from rlpulse.transport.clients import new_admin
from rlpulse.transport.topics import ensure_topics
from tests.integration.killed_rank import TWO_THREADS, Accepted
from tests.integration.scrape import scrape
from tests.integration.scripted_run import consume_all
from tests.kafka import settings_at
from tests.waiting import wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]

RANKS = 4
STEP_INTERVAL_S = 0.1
DELIVERY_TIMEOUT_S = 4.0
GRACE_S = 3.0

EventId = tuple[str, int]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A broker of this module only, on a fixed port; each test stops and starts it."""
    local = LocalBroker(
        Settings(), state_dir=tmp_path_factory.mktemp("fault-broker"), port=free_port()
    )
    try:
        yield local
    finally:
        local.down()


def bootstrap_of(broker: LocalBroker) -> str:
    return f"127.0.0.1:{broker.port}"


def bring_up(broker: LocalBroker, topics: Topics) -> None:
    """Start the broker, create the topics, wait until every events partition has a leader."""
    broker.up()
    ensure_topics(settings_at(bootstrap_of(broker)), topics, partitions=3)
    admin = new_admin(settings_at(bootstrap_of(broker)))

    def leaders() -> bool:
        found = admin.list_topics(topic=topics.events, timeout=10).topics.get(topics.events)
        return found is not None and all(p.leader >= 0 for p in found.partitions.values())

    wait_for(leaders, "partition leaders", 60.0)


def in_background(action: Callable[[], object], delay_s: float = 0.0) -> threading.Thread:
    """Run ``action`` after ``delay_s`` in a thread (the training loop goes on meanwhile)."""

    def run() -> None:
        time.sleep(delay_s)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


class SimulatedRanks:
    """``RANKS`` in-process EventLoggers of one run, logging one event per rank per step."""

    def __init__(self, broker: LocalBroker, topics: Topics, spool_dir: Path) -> None:
        self.run_id = f"run-{uuid.uuid4().hex[:8]}"
        settings = settings_at(
            bootstrap_of(broker),
            topics,
            producer=ProducerSettings(spool_dir=spool_dir, delivery_timeout_s=DELIVERY_TIMEOUT_S),
            librdkafka={"reconnect.backoff.max.ms": 1000},
        )
        self.loggers = [
            EventLogger(self.run_id, rank=rank, world_size=RANKS, settings=settings)
            for rank in range(RANKS)
        ]
        self.steps = 0
        self.slowest_log_s = 0.0

    @staticmethod
    def value(step: int, rank: int) -> float:
        return step * 10.0 + rank

    def run_while(self, busy: Callable[[], bool], min_s: float = 0.0) -> None:
        """Log a step every ``STEP_INTERVAL_S`` while ``busy()`` or for at least ``min_s``."""
        until = time.monotonic() + min_s
        while busy() or time.monotonic() < until:
            for rank, logger in enumerate(self.loggers):
                start = time.perf_counter()
                logger.log({"x": self.value(self.steps, rank)}, self.steps, "rollout")
                self.slowest_log_s = max(self.slowest_log_s, time.perf_counter() - start)
            self.steps += 1
            time.sleep(STEP_INTERVAL_S)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close(timeout_s=30.0)
        print(
            f"{self.run_id}: {self.steps} steps x {RANKS} ranks; slowest log() "
            f"{self.slowest_log_s * 1e3:.2f} ms; delivered live "
            f"{sum(lg.delivered for lg in self.loggers)}, spooled "
            f"{sum(lg.resent for lg in self.loggers)}, dropped "
            f"{sum(lg.dropped for lg in self.loggers)}"
        )

    def expected_ids(self) -> set[EventId]:
        return {(lg.producer_id, seq) for lg in self.loggers for seq in range(lg.logged)}


def events_on_topic(bootstrap: str, topic: str) -> list[TrainerEvent]:
    """Every event on ``topic``, read up to the end each partition has now.

    Right after a restart the broker may still answer "not leader" for a while: retried.
    """
    deadline = time.monotonic() + 60
    while True:
        try:
            return _read_to_end(bootstrap, topic)
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _read_to_end(bootstrap: str, topic: str) -> list[TrainerEvent]:
    codec = default_codec()
    return [codec.decode_event(value) for value in _values_to_end(bootstrap, topic)]


def _values_to_end(bootstrap: str, topic: str) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic=topic, timeout=30).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in partitions
        }
        todo = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in todo])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                assert msg.error() is None, msg.error()
                values.append(msg.value() or b"")
                partition, offset = msg.partition(), msg.offset()
                if partition is not None and offset is not None and offset + 1 >= ends[partition]:
                    todo.discard(partition)
        assert not todo, f"partitions {todo} of {topic} not read to their end"
        return values
    finally:
        consumer.close()


def assert_exactly_once(events: list[TrainerEvent], expected: set[EventId]) -> int:
    """Every expected event is on the topic once, nothing else; returns the duplicates (0)."""
    counts = Counter((e["producer_id"], e["seq"]) for e in events)
    missing = expected - set(counts)
    assert not missing, f"{len(missing)} of {len(expected)} events never arrived"
    assert set(counts) == expected, f"unexpected events: {sorted(set(counts) - expected)[:5]}"
    twice = sorted(event for event, count in counts.items() if count > 1)
    assert not twice, f"{len(twice)} event(s) on the topic more than once: {twice[:5]}"
    print(f"{len(expected)} events arrived, each once")
    return 0


def assert_no_log_left(spool_dir: Path) -> None:
    """The host's agent deletes each log once its writer is gone and all of it arrived.

    It asserts the end state: the logs the agent deletes while it looks are not an error.
    """
    wait_for(
        lambda: not logs_under(spool_dir),
        "the host's agent to send and delete every write-ahead log",
        timeout_s=30.0,
        every_s=0.1,
        state=lambda: f"write-ahead logs left: {logs_under(spool_dir)}",
    )


def assert_steps_summarised(
    broker: LocalBroker, topics: Topics, ranks: SimulatedRanks, log: Path, on_wire: int
) -> None:
    """Run a real worker over the run; each step's summary has every rank once, each summary
    is published once, and the worker counted exactly the ``on_wire`` duplicates as such."""
    bootstrap = bootstrap_of(broker)
    codec = default_codec()
    final: dict[int, StepSummary] = {}

    def every_step_complete(values: list[bytes]) -> bool:
        for summary in map(codec.decode_summary, values[len(seen) :]):
            seen.append(summary)
            step = summary["step"]
            if summary["run_id"] == ranks.run_id and (
                step not in final or summary["revision"] > final[step]["revision"]
            ):
                final[step] = summary
        return len(final) == ranks.steps and all(
            s["ranks_reported"] == list(range(RANKS)) for s in final.values()
        )

    seen: list[StepSummary] = []
    port = free_port()
    worker = WorkerProcess(
        bootstrap,
        topics.prefix,
        log,
        partitions=3,
        grace_s=GRACE_S,
        extra_args=("--metrics-port", str(port), "--metrics-host", "127.0.0.1"),
    )
    worker.start()
    try:
        worker.wait_consuming(timeout_s=90.0)
        consume_all(bootstrap, topics.steps, every_step_complete, timeout_s=90.0)
        counters = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        worker.stop()
    events = len(events_on_topic(bootstrap, topics.events))
    assert counters["rlpulse_events_total"] == events
    assert counters["rlpulse_duplicate_events_total"] == on_wire
    ids = Counter(s["summary_id"] for s in seen if s["run_id"] == ranks.run_id)
    assert max(ids.values()) == 1, "a summary was published twice"
    assert sorted(final) == list(range(ranks.steps))
    for step, summary in final.items():
        assert summary["ranks_reported"] == list(range(RANKS)), summary
        stats = summary["metrics"]["x"]
        assert stats["count"] == RANKS, summary
        assert stats["sum"] == sum(ranks.value(step, r) for r in range(RANKS)), summary


def test_a_broker_down_at_start_comes_up_20s_later(broker: LocalBroker, tmp_path: Path) -> None:
    broker.down()
    topics = Topics(prefix=f"fault-a-{uuid.uuid4().hex[:8]}")
    ranks = SimulatedRanks(broker, topics, tmp_path / "spool")
    coming_up = in_background(lambda: bring_up(broker, topics), delay_s=20.0)
    ranks.run_while(coming_up.is_alive, min_s=20.0)
    ranks.run_while(lambda: False, min_s=3.0)  # a little more with the broker up
    ranks.close()
    assert sum(lg.resent for lg in ranks.loggers) > 0, "the outage should have failed sends"
    assert_no_log_left(tmp_path / "spool")
    events = events_on_topic(bootstrap_of(broker), topics.events)
    on_wire = assert_exactly_once(events, ranks.expected_ids())
    assert_steps_summarised(broker, topics, ranks, tmp_path / "worker.log", on_wire)


def test_b_broker_stopped_30s_mid_run(broker: LocalBroker, tmp_path: Path) -> None:
    topics = Topics(prefix=f"fault-b-{uuid.uuid4().hex[:8]}")
    bring_up(broker, topics)
    ranks = SimulatedRanks(broker, topics, tmp_path / "spool")
    ranks.run_while(lambda: False, min_s=3.0)
    going_down = in_background(broker.down)
    ranks.run_while(going_down.is_alive)
    ranks.run_while(lambda: False, min_s=30.0)  # the broker is down for 30 s
    coming_up = in_background(lambda: bring_up(broker, topics))
    ranks.run_while(coming_up.is_alive, min_s=3.0)
    ranks.close()
    assert sum(lg.resent for lg in ranks.loggers) > 0, "the outage should have failed sends"
    assert_no_log_left(tmp_path / "spool")
    events = events_on_topic(bootstrap_of(broker), topics.events)
    on_wire = assert_exactly_once(events, ranks.expected_ids())
    assert_steps_summarised(broker, topics, ranks, tmp_path / "worker.log", on_wire)


# -- (d) issue 22, and the host agent: SIGKILL mid-run; nobody of the run comes back --------


def log_records_on_topic(bootstrap: str, topic: str) -> list[LogRecord]:
    """Every log record on ``topic`` (read to the end each partition has now)."""
    codec = default_codec()
    return [
        record for value in _values_to_end(bootstrap, topic) for record in codec.decode_logs(value)
    ]


@pytest.mark.parametrize("fault", ["mid-batch", "broker-outage"])
def test_d_a_killed_trainer_s_every_accepted_record_arrives_once(
    broker: LocalBroker, tmp_path: Path, fault: str
) -> None:
    """A trainer logging events and records from two threads is SIGKILLed (1) mid-batch, its
    agent's deliveries in flight, or (2) during a broker outage. Nothing of the run comes
    back: the host's agent sends what the write-ahead log holds (after the outage, once the
    broker is back) and deletes the log. Every event and record ``log()`` accepted is on its
    topic exactly once (count and identity), and in the archive exactly once (the audit
    finds no gap and no duplicate)."""
    topics = Topics(prefix=f"fault-d-{uuid.uuid4().hex[:8]}")
    bring_up(broker, topics)
    bootstrap, spool_dir, run_id = bootstrap_of(broker), tmp_path / "spool", f"run-{fault}"
    child = subprocess.Popen(
        [sys.executable, "-c", TWO_THREADS, bootstrap, topics.prefix, str(spool_dir), run_id,
         str(DELIVERY_TIMEOUT_S)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(child.stdout or []), daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(lines) > 2000, "the child to log", 60.0)
        if fault == "broker-outage":
            broker.down()
            time.sleep(DELIVERY_TIMEOUT_S + 2.0)  # deliveries fail; more waits in the log
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    reader.join(5.0)
    accepted = Accepted([line for line in lines if line.endswith("\n")])
    if fault == "broker-outage":
        bring_up(broker, topics)
    wait_for(lambda: not logs_under(spool_dir), "the agent to send the log and delete it", 120.0)
    events = [
        e
        for e in events_on_topic(bootstrap, topics.events)
        if e["producer_id"] == accepted.producer_id
    ]
    records = [
        r
        for r in log_records_on_topic(bootstrap, topics.logs)
        if r["producer_id"] == accepted.producer_id
    ]
    print(
        f"{fault}: killed after {accepted.events + 1} events and {accepted.records + 1}+ records "
        f"accepted; on the topics {len(events)} events, {len(records)} records"
    )
    seqs = Counter([e["seq"] for e in events] + [r["seq"] for r in records])
    assert max(seqs.values()) == 1, "a record reached its topic twice"
    assert sorted(seqs) == list(range(len(seqs))), "a seq is missing between the first and last"
    indexes = sorted(int(e["metrics"]["index"]) for e in events)
    assert indexes == list(range(len(indexes))) and len(indexes) >= accepted.events + 1
    texts = sorted(int(r["message"].split()[1]) for r in records)
    assert texts == list(range(len(texts))) and len(texts) >= accepted.records + 1
    assert all(r["step"] == int(r["message"].split()[1]) for r in records)
    assert_archived_once(bootstrap, topics, tmp_path, run_id, len(events) + len(records))


def assert_archived_once(
    bootstrap: str, topics: Topics, tmp_path: Path, run_id: str, dead: int
) -> None:
    """An archiver writes the run; each (producer, seq) is in it once and the audit is clean."""
    root = tmp_path / "archive"
    archiver = ArchiverProcess(
        bootstrap, topics.prefix, root, tmp_path / "archiver.log",
        {"archive.roll_s": 1, "archive.audit": "false"},
    ).start()  # fmt: skip
    sql = (
        "SELECT producer_id, seq, count(*) FROM (SELECT producer_id, seq FROM events "
        "WHERE run_id = ? UNION ALL SELECT producer_id, seq FROM logs WHERE run_id = ?) "
        "GROUP BY producer_id, seq"
    )
    rows: list[tuple[Any, ...]] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if root.exists():
                rows = query_archive(str(root), topics, sql, [run_id, run_id])[1]
                if len(rows) >= dead:
                    break
            time.sleep(0.5)
    finally:
        archiver.stop()
    assert len(rows) == dead, f"{len(rows)} of {dead} records archived"
    assert {count for _producer, _seq, count in rows} == {1}, "a record archived twice"
    audit = subprocess.run(
        [sys.executable, "-m", "rlpulse", "audit", "--run", run_id, "--archive", str(root),
         "--prefix", topics.prefix],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "0 lost, 0 duplicates" in " ".join(audit.stdout.split()), audit.stdout
