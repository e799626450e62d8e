"""The trainer-side clients against a real broker: events out, commands in, acks out."""

from __future__ import annotations

import concurrent.futures
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from rlpulse.producers import ControlClient, EventHandler, EventLogger, RunLink, Settings
from rlpulse.producers.delivery.spool import send_logs
from rlpulse.producers.delivery.wal import logs_under
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import CommandAck, ControlCommand
from rlpulse.schemas.topics import Topics
from rlpulse.settings import AgentSettings, ProducerSettings
from rlpulse.transport.clients import trainer_producer
from rlpulse.transport.topics import LATEST_OFFSET, delete_topics, ensure_topics
from tests.kafka import settings_at, stop_agents

pytestmark = pytest.mark.broker

WAIT_S = 30.0


def command(
    run_id: str, attempt: int = 0, name: str = "c", *, dry_run: bool = False
) -> ControlCommand:
    return {
        "command_id": f"{run_id}-{attempt}-{name}",
        "run_id": run_id,
        "attempt": attempt,
        "stage": "rollout",
        "step": 7,
        "origin": "rule",
        "rule_id": "unstable-reward",
        "rule_version": "1",
        "dry_run": dry_run,
        "actions": [{"type": "scale_rollout_batch", "params": {"factor": 2, "max": 256}}],
        "reason": "variance of reward_mean over 5 steps is 0.61 > 0.5",
        "evidence": {"reward_mean_var": 0.61},
        "issued_ns": time.time_ns(),
        "signature": None,
    }


def publish(bootstrap: str, topic: str, messages: Iterable[tuple[str, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for key, value in messages:
        producer.produce(topic, key=key.encode(), value=value)
    assert producer.flush(WAIT_S) == 0


def publish_commands(bootstrap: str, topics: Topics, commands: Iterable[ControlCommand]) -> None:
    codec = default_codec()
    publish(
        bootstrap,
        topics.control,
        ((c["run_id"], codec.encode("ControlCommand", c)) for c in commands),
    )


def read_topic(bootstrap: str, topic: str, count: int) -> list[tuple[bytes | None, bytes]]:
    """Read ``count`` messages (key, value) of ``topic`` from the beginning of every partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic=topic, timeout=WAIT_S).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        found: list[tuple[bytes | None, bytes]] = []
        deadline = time.monotonic() + WAIT_S
        while len(found) < count and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.2):
                assert msg.error() is None, msg.error()
                value = msg.value()
                assert value is not None
                found.append((msg.key(), value))
        assert len(found) == count, f"{len(found)} of {count} messages on {topic}"
        return found
    finally:
        consumer.close()


def poll_until(
    client: ControlClient, done: Callable[[list[ControlCommand]], bool]
) -> list[ControlCommand]:
    """Poll ``client`` until ``done(everything returned so far)``, within ``WAIT_S``."""
    returned: list[ControlCommand] = []
    deadline = time.monotonic() + WAIT_S
    while not done(returned):
        assert time.monotonic() < deadline, f"only got {[c['command_id'] for c in returned]}"
        returned.extend(client.poll(timeout_s=0.2))
    return returned


def ids(commands: Iterable[ControlCommand]) -> list[str]:
    return [c["command_id"] for c in commands]


def settings_for(kafka_bootstrap: str, topics: Topics) -> Settings:
    return settings_at(kafka_bootstrap, topics)


def test_logged_events_arrive_decodable_and_in_sequence(
    kafka_bootstrap: str, topics: Topics
) -> None:
    with EventLogger(
        "run-a",
        rank=1,
        world_size=2,
        tags={"model": "qwen"},
        settings=settings_for(kafka_bootstrap, topics),
    ) as logger:
        logger.run_start()
        for step in range(5):
            logger.log(
                {"reward_mean": 2.5 + step, "tokens": 100 * step}, step=step, stage="rollout"
            )
        logger.log({}, 4, kind="log", level="INFO", message="epoch done")
        logger.run_end(5)
        assert logger.flush(WAIT_S) == 0
        assert (logger.logged, logger.delivered, logger.resent, logger.dropped) == (8, 8, 0, 0)

    codec = default_codec()
    messages = read_topic(kafka_bootstrap, topics.events, 8)
    assert {key for key, _ in messages} == {b"run-a"}
    events = [codec.decode_event(value) for _, value in messages]
    assert [e["seq"] for e in events] == list(range(8))
    assert {e["producer_id"] for e in events} == {logger.producer_id}
    assert [e["kind"] for e in events] == ["run_start"] + ["metrics"] * 5 + ["log", "run_end"]
    metrics = events[3]
    assert metrics["metrics"] == {"reward_mean": 4.5, "tokens": 200.0}
    assert (metrics["run_id"], metrics["stage"], metrics["step"]) == ("run-a", "rollout", 2)
    assert (metrics["rank"], metrics["world_size"], metrics["attempt"]) == (1, 2, 0)
    assert metrics["tags"] == {"model": "qwen"}
    assert metrics["pid"] > 0 and metrics["hostname"]
    assert events[6]["message"] == "epoch done" and events[6]["level"] == "INFO"
    timestamps = [e["timestamp_ns"] for e in events]
    assert timestamps == sorted(timestamps)


def test_flush_counts_what_was_logged_before_it_while_another_thread_logs(
    kafka_bootstrap: str, topics: Topics
) -> None:
    """A RunLink's system-metrics thread logs while the loop flushes its step: flush returns 0."""
    with EventLogger("run-busy", settings=settings_for(kafka_bootstrap, topics)) as logger:
        stop = threading.Event()

        def chatter() -> None:
            while not stop.is_set():
                logger.log({"cpu": 1.0}, 0, stage="system")
                time.sleep(0.001)

        thread = threading.Thread(target=chatter)
        thread.start()
        try:
            for step in range(1, 21):
                logger.log({"reward_mean": 1.0}, step, stage="rollout")
                assert logger.flush(WAIT_S) == 0, f"step {step}"
        finally:
            stop.set()
            thread.join()
        assert logger.flush(WAIT_S) == 0


def test_control_client_returns_only_new_commands_of_its_run_attempt(
    kafka_bootstrap: str, topics: Topics, caplog: pytest.LogCaptureFixture
) -> None:
    mine = [command("run-a", 0, "c1"), command("run-a", 0, "c2")]
    dry = command("run-a", 0, "dry", dry_run=True)
    sentinel = command("run-a", 0, "last")
    publish_commands(
        kafka_bootstrap,
        topics,
        [
            mine[0],
            command("run-a", 1, "other-attempt"),
            command("run-b", 0, "other-run"),
            mine[0],  # duplicate
            dry,
            mine[1],
            dry,
        ],
    )
    codec = default_codec()
    publish(
        kafka_bootstrap,
        topics.control,
        [
            ("run-a", b"not avro at all"),
            ("run-a", codec.encode("ControlCommand", command("run-b", 0, "wrong-key"))),
            ("run-a", codec.encode("ControlCommand", sentinel)),
        ],
    )

    caplog.set_level(logging.INFO, logger="rlpulse.producers")
    with ControlClient("run-a", settings=settings_for(kafka_bootstrap, topics)) as client:
        returned = poll_until(client, lambda got: sentinel["command_id"] in ids(got))
        assert ids(returned) == ["run-a-0-c1", "run-a-0-c2", "run-a-0-last"]
        assert returned[0] == mine[0]
        assert ids(client.dry_run_seen) == ["run-a-0-dry"]
        assert client.poll(timeout_s=0.5) == []
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("undecodable" in w and "garbage" in w for w in warnings), warnings
        assert any("addressed to run 'run-b'" in w for w in warnings), warnings

        assert client.ack(
            returned[0], "applied", applied_at_step=12, detail={"old": "64", "new": "128"}
        )
        assert client.ack(returned[1], "rejected", detail={"why": "already at max"})
        assert client.acked_command_ids == {"run-a-0-c1", "run-a-0-c2"}

    acks: list[CommandAck] = []
    for key, value in read_topic(kafka_bootstrap, topics.acks, 2):
        assert key == b"run-a"
        acks.append(codec.decode_ack(value))
    first, second = acks
    assert (first["command_id"], first["status"], first["applied_at_step"]) == (
        "run-a-0-c1",
        "applied",
        12,
    )
    assert first["detail"] == {"old": "64", "new": "128"}
    assert (first["run_id"], first["attempt"]) == ("run-a", 0)
    assert (second["command_id"], second["status"], second["applied_at_step"]) == (
        "run-a-0-c2",
        "rejected",
        None,
    )


def test_restarted_client_does_not_return_acked_commands(
    kafka_bootstrap: str, topics: Topics
) -> None:
    settings = settings_for(kafka_bootstrap, topics)
    first, second = command("run-a", 0, "c1"), command("run-a", 0, "c2")
    publish_commands(kafka_bootstrap, topics, [first, second])
    with ControlClient("run-a", settings=settings) as client:
        returned = poll_until(client, lambda got: len(got) >= 2)
        assert ids(returned) == ["run-a-0-c1", "run-a-0-c2"]
        assert client.ack(returned[0], "applied", applied_at_step=8)

    # Another run's ack of the same id must not hide the command from this run.
    codec = default_codec()
    other_ack: CommandAck = {
        "command_id": "run-a-0-c2",
        "run_id": "run-b",
        "attempt": 0,
        "status": "applied",
        "applied_at_step": None,
        "detail": {},
        "acked_ns": time.time_ns(),
    }
    publish(kafka_bootstrap, topics.acks, [("run-b", codec.encode("CommandAck", other_ack))])

    publish_commands(kafka_bootstrap, topics, [command("run-a", 0, "c3")])
    with ControlClient("run-a", settings=settings) as restarted:
        returned = poll_until(restarted, lambda got: "run-a-0-c3" in ids(got))
        assert ids(returned) == ["run-a-0-c2", "run-a-0-c3"]
        assert restarted.acked_command_ids == {"run-a-0-c1"}


def test_control_client_waits_for_topics_created_later(kafka_bootstrap: str) -> None:
    topics = Topics(prefix=f"test-late-{uuid.uuid4().hex[:10]}")
    settings = settings_at(kafka_bootstrap, topics)
    with ControlClient("run-a", settings=settings) as client:
        assert client.poll() == []
        assert not client.started
        ensure_topics(settings_at(kafka_bootstrap), topics, partitions=3)
        publish_commands(kafka_bootstrap, topics, [command("run-a", 0, "c1")])
        returned = poll_until(client, lambda got: len(got) >= 1)
        assert ids(returned) == ["run-a-0-c1"]
        assert client.started


def test_run_link_round_trip(kafka_bootstrap: str, topics: Topics) -> None:
    settings = settings_for(kafka_bootstrap, topics)
    publish_commands(kafka_bootstrap, topics, [command("run-l", 2, "stop")])
    with RunLink("run-l", rank=0, world_size=4, attempt=2, settings=settings) as link:
        link.log({"kl_divergence": 0.31}, step=3, stage="actor")
        deadline = time.monotonic() + WAIT_S
        commands: list[ControlCommand] = []
        while not commands:
            assert time.monotonic() < deadline
            commands = link.poll_commands(timeout_s=0.2)
        assert ids(commands) == ["run-l-2-stop"]
        assert link.ack(commands[0], "applied", applied_at_step=3)
        assert link.flush(WAIT_S) == 0
    codec = default_codec()
    event, end = [codec.decode_event(v) for _, v in read_topic(kafka_bootstrap, topics.events, 2)]
    assert (event["attempt"], event["world_size"], event["stage"]) == (2, 4, "actor")
    # leaving the with block closed the link, which ended the run (a scale command is no stop)
    assert (end["kind"], end["attempt"], end["step"], end["message"]) == ("run_end", 2, 3, "closed")
    (ack,) = [codec.decode_ack(v) for _, v in read_topic(kafka_bootstrap, topics.acks, 1)]
    assert (ack["command_id"], ack["attempt"], ack["status"]) == ("run-l-2-stop", 2, "applied")


def test_logging_handler_publishes_stdlib_records(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    settings = settings_at(kafka_bootstrap, topics, producer=ProducerSettings(spool_dir=tmp_path))
    trainer_log = logging.getLogger(f"trainer-{uuid.uuid4().hex}")
    trainer_log.setLevel(logging.INFO)
    trainer_log.propagate = False
    with RunLink("run-h", rank=1, world_size=2, settings=settings) as link:
        handler = EventHandler(link, stage="trainer")
        trainer_log.addHandler(handler)
        try:
            trainer_log.info({"step": 120, "stage": "rollout", "reward_mean": 2.4, "kl": 0.18})
            trainer_log.info({"step": 121, "actor": {"loss": 0.5}, "note": "warmup done"})
            trainer_log.warning("grad norm %.1f is high", 12.5)
            trainer_log.debug({"step": 122, "ignored": 1.0})  # below the logger's level
        finally:
            trainer_log.removeHandler(handler)
        assert link.flush(WAIT_S) == 0
    codec = default_codec()
    events = [codec.decode_event(v) for _, v in read_topic(kafka_bootstrap, topics.events, 2)]
    first, second = sorted(events, key=lambda e: e["seq"])
    assert (first["kind"], first["step"], first["stage"], first["rank"]) == (
        "metrics",
        120,
        "rollout",
        1,
    )
    assert first["metrics"] == {"reward_mean": 2.4, "kl": 0.18}
    assert (second["step"], second["stage"], second["metrics"]) == (
        121,
        "trainer",
        {"actor/loss": 0.5},
    )
    assert second["message"] == '{"note": "warmup done"}'
    (batch,) = read_topic(kafka_bootstrap, topics.logs, 1)
    (text,) = codec.decode_logs(batch[1])
    assert (text["level"], text["message"], text["step"], text["logger"]) == (
        "WARNING",
        "grad norm 12.5 is high",
        121,
        trainer_log.name,
    )
    assert text["seq"] == 2  # one numbering for the producer's events and log records


def left_unsent(topics: Topics, spool_dir: Path, run_id: str, count: int) -> EventLogger:
    """A logger that could not reach any broker, on a host whose agent runs only by hand and
    does not: its ``count`` events stay in its log."""
    settings = settings_at(
        "127.0.0.1:1", topics, producer=ProducerSettings(spool_dir=spool_dir),
        agent=AgentSettings(start="never"),
    )  # fmt: skip
    logger = EventLogger(run_id, settings=settings)
    for step in range(count):
        logger.log({"loss": float(step)}, step)
    assert logger.close(timeout_s=0.2) == count
    return logger


def test_send_logs_sends_a_log_once_and_deletes_it(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    dead = left_unsent(topics, tmp_path, "run-r", 30)
    settings = settings_for(kafka_bootstrap, topics)
    report = send_logs(tmp_path, settings)
    assert (report.delivered, report.undelivered, report.logs) == (30, 0, 1)
    assert logs_under(tmp_path) == []
    assert send_logs(tmp_path, settings).delivered == 0  # nothing left to send twice
    codec = default_codec()
    events = [codec.decode_event(v) for _, v in read_topic(kafka_bootstrap, topics.events, 30)]
    assert sorted(e["seq"] for e in events) == list(range(30))
    assert {e["producer_id"] for e in events} == {dead.producer_id}


def test_log_from_eight_threads_keeps_seq_in_log_order(
    kafka_bootstrap: str, topics: Topics
) -> None:
    """log() promises seq order = log order whichever threads log: on the (one) partition
    of the run the seqs are 0, 1, 2, ... in offset order, and each thread's events keep the
    order that thread logged them in."""
    threads, per_thread = 8, 250
    logger = EventLogger("run-threads", settings=settings_for(kafka_bootstrap, topics))
    start = threading.Barrier(threads)

    def log_from(thread: int) -> None:
        start.wait(timeout=30)
        for index in range(per_thread):
            logger.log({"thread": float(thread), "index": float(index)}, step=index)

    with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(log_from, t) for t in range(threads)]:
            future.result(timeout=60)
    assert logger.flush(WAIT_S) == 0
    logger.close()
    total = threads * per_thread
    codec = default_codec()
    events = [codec.decode_event(v) for _, v in read_topic(kafka_bootstrap, topics.events, total)]
    assert [e["seq"] for e in events] == list(range(total))  # offset order is seq order
    for thread in range(threads):
        mine = [e["metrics"]["index"] for e in events if e["metrics"]["thread"] == thread]
        assert mine == [float(i) for i in range(per_thread)], f"thread {thread} reordered"


def test_replay_still_runs_spool_send_and_says_it_is_deprecated(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    left_unsent(topics, tmp_path, "run-cli", 5)
    result = subprocess.run(
        [sys.executable, "-m", "rlpulse", "replay", str(tmp_path), "--bootstrap", kafka_bootstrap],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "The command 'replay' is deprecated" in result.stderr
    assert "sent 5 record(s) from 1 write-ahead log(s)" in result.stdout
    read_topic(kafka_bootstrap, topics.events, 5)
    assert logs_under(tmp_path) == []


def test_spool_send_dir_exits_1_and_keeps_the_files_when_kafka_is_unreachable(
    topics: Topics, tmp_path: Path
) -> None:
    left_unsent(topics, tmp_path, "run-cli", 5)
    kept = logs_under(tmp_path)
    command = [sys.executable, "-m", "rlpulse", "spool", "send", str(tmp_path)]
    result = subprocess.run(
        [*command, "--bootstrap", "127.0.0.1:1", "--timeout", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "5 record(s) in 1 log(s) not sent; the logs are kept" in result.stderr
    assert (
        "5 record(s) not sent: Kafka at 127.0.0.1:1 did not answer within 2 s (Connect to "
        "ipv4#127.0.0.1:1 failed: Connection refused)"
    ) in result.stderr
    assert "rdkafka" not in result.stderr and "_TRANSPORT" not in result.stderr
    assert "Traceback" not in result.stderr
    assert logs_under(tmp_path) == kept


def test_the_trainer_producer_writing_while_its_topic_is_created_loses_nothing(
    kafka_bootstrap: str,
) -> None:
    """A trainer may start before the worker creates the topics: it writes as they appear.

    The metadata names a new partition's leader before the broker serves it; with several
    requests in flight, a refused one could be overtaken by the next, and Kafka then refused
    its retries while librdkafka reported its records delivered (one CI run lost a run's
    first event). Many partitions make the broker take longer to serve them all, which
    widens the window; each round streams to every partition through it.
    """
    settings = settings_at(kafka_bootstrap)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    partitions = 300
    for _round in range(2):
        topic = f"test-born-{uuid.uuid4().hex[:10]}"
        producer = trainer_producer(settings, "test")
        delivered = 0

        def count(error: KafkaError | None, _message: object) -> None:
            nonlocal delivered
            delivered += error is None

        sent = 0
        created: float | None = None
        try:  # 300 before the topic exists, then a stream for 3 s while its partitions appear
            while created is None or time.monotonic() - created < 3.0:
                if sent == 300:  # librdkafka holds these until the topic exists
                    admin.create_topics([NewTopic(topic, num_partitions=partitions)])
                    created = time.monotonic()
                producer.produce(topic, b"x", partition=sent % partitions, on_delivery=count)
                sent += 1
                producer.poll(0)
                time.sleep(0.001)
            assert producer.flush(WAIT_S) == 0
            written = sum(high for _low, high in watermarks(kafka_bootstrap, topic, partitions))
            assert (delivered, written) == (sent, sent)
        finally:
            delete_topics(settings, [topic])


def test_ensure_topics_returns_once_every_partition_is_served(kafka_bootstrap: str) -> None:
    """What rlpulse creates is written at once: no request meets a leader not serving yet."""
    topics = Topics(prefix=f"test-served-{uuid.uuid4().hex[:10]}")
    settings = settings_at(kafka_bootstrap)
    try:
        ensure_topics(settings, topics, partitions=40)
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        requests = {
            TopicPartition(name, partition): LATEST_OFFSET
            for name in topics.all()
            for partition in range(len(admin.list_topics(name).topics[name].partitions))
        }
        refused = []
        for tp, future in admin.list_offsets(requests, request_timeout=WAIT_S).items():
            try:
                future.result()
            except KafkaException as exc:
                refused.append(f"{tp.topic} [{tp.partition}]: {exc}")
        assert refused == []
    finally:
        delete_topics(settings, list(topics.all()))


def watermarks(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int]]:
    """The low and high watermark of each partition of ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=WAIT_S)
            for partition in range(partitions)
        ]
    finally:
        consumer.close()


def test_records_for_a_missing_topic_say_the_topic_is_missing(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = Topics(prefix=f"missing-{uuid.uuid4().hex[:8]}")
    producer = ProducerSettings(spool_dir=tmp_path, delivery_timeout_s=1.0)
    caplog.set_level(logging.WARNING, logger="rlpulse.producers")
    logger = EventLogger("run-m", settings=settings_at(kafka_bootstrap, missing, producer=producer))
    logger.log({"loss": 1.0}, 1)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "cannot be delivered" in r.getMessage()]

    deadline = time.monotonic() + 60
    while not said() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert logger.close(timeout_s=0) == 1  # it waits in the write-ahead log
    stop_agents(tmp_path)  # it would keep trying until the topic exists
    (line,) = said()
    assert f"topic {missing.events} does not exist (Kafka does not create topics" in line
    assert "`rlpulse worker` creates its prefix's topics when it starts" in line
    assert "Message timed out" not in line


def test_spool_send_dir_names_the_cause_per_log_and_carries_on(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    missing = Topics(prefix=f"missing-{uuid.uuid4().hex[:8]}")
    left_unsent(missing, tmp_path / "a", "run-gone", 5)  # sent first
    left_unsent(topics, tmp_path / "b", "run-here", 3)
    command = [sys.executable, "-m", "rlpulse", "spool", "send", str(tmp_path)]
    result = subprocess.run(
        [*command, "--bootstrap", kafka_bootstrap, "--timeout", "10"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "sent 3 record(s) from 1 write-ahead log(s)" in result.stdout
    (kept,) = [line for line in result.stderr.splitlines() if "not sent:" in line]
    assert kept.startswith(str(tmp_path / "a"))
    assert kept.endswith(
        f": 5 record(s) not sent: topic {missing.events} does not exist (Kafka does not "
        "create topics on first use; `rlpulse worker` creates its prefix's topics when it starts)"
    )
    assert "5 record(s) in 1 log(s) not sent; the logs are kept" in result.stderr
    read_topic(kafka_bootstrap, topics.events, 3)
    assert logs_under(tmp_path / "b") == []
    assert len(logs_under(tmp_path / "a")) == 1
