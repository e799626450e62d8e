"""The worker and `rlpulse rules backtest` issue the same commands for the same recorded run.

Both drive :class:`~rlpulse.streams.pipeline.StepPipeline`; this test plays the recorded
8-rank run (two attempts, a NaN, a rank that never reports a step, a stop) through a real
worker process over Kafka and through the backtest, and compares what came out. Every event
goes to Kafka twice (same producer id and seq, as a replayed spool would send it): the
worker must drop each second copy — count it, and neither change a summary nor emit a
revision for it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rlpulse.local.child_process import free_port
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.offline.backtest import RecordedEvent, read_recording, run_backtest
from rlpulse.rules import load_rules
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import ControlCommand
from rlpulse.schemas.topics import Topics
from rlpulse.settings import JoinerSettings
from rlpulse.transport.clients import trainer_producer
from tests.integration.scrape import scrape
from tests.integration.scripted_run import consume_all
from tests.kafka import read_to_end, settings_at

pytestmark = pytest.mark.broker

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
RECORDING = RUNS / "run.jsonl"
RULES = RUNS / "features.yaml"
GRACE_S = 3.0


def test_worker_and_backtest_issue_identical_commands(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    expected = run_backtest(
        load_rules(RULES), read_recording(RECORDING), JoinerSettings(grace_s=GRACE_S)
    ).commands
    assert len(expected) >= 5, "the recording must make several rules fire"
    events = [item.event for item in read_recording(RECORDING) if isinstance(item, RecordedEvent)]

    port = free_port()
    worker = WorkerProcess(
        kafka_bootstrap,
        topics.prefix,
        tmp_path / "worker.log",
        rules=str(RULES),
        partitions=3,
        grace_s=GRACE_S,
        extra_args=("--metrics-port", str(port), "--metrics-host", "127.0.0.1"),
    )
    codec = default_codec()
    with worker:
        worker.wait_consuming(timeout_s=90)
        producer = trainer_producer(settings_at(kafka_bootstrap, topics), "recording")
        for event in events:
            value = codec.encode("TrainerEvent", event)
            for _copy in range(2):
                producer.produce(topics.events, key=event["run_id"].encode(), value=value)
            producer.poll(0)
        assert producer.flush(30) == 0
        wanted = {command["command_id"] for command in expected}

        def all_came(values: list[bytes]) -> bool:
            return wanted <= {codec.decode_command(v)["command_id"] for v in values}

        published = consume_all(kafka_bootstrap, topics.control, all_came, timeout_s=120)
        summaries = [
            codec.decode_summary(message.value())
            for message in read_to_end(kafka_bootstrap, topics.steps)
        ]
        counters = scrape(f"http://127.0.0.1:{port}/metrics")
    got: list[ControlCommand] = [codec.decode_command(value) for value in published]
    assert counters["rlpulse_events_total"] == 2 * len(events)
    joined = [e for e in events if e["kind"] in ("metrics", "log")]  # run_start/end: no seq check
    assert counters["rlpulse_duplicate_events_total"] == len(joined)
    revisions = Counter((s["attempt"], s["stage"], s["step"], s["revision"]) for s in summaries)
    assert max(revisions.values()) == 1, "a summary was sent twice"
    assert {revision for (*_, revision) in revisions} == {1}, "a duplicate made a revision"

    def key(command: ControlCommand) -> tuple[str, str]:
        return command["command_id"], command["reason"]

    assert sorted(map(key, got)) == sorted(map(key, expected))
    assert len({c["command_id"] for c in got}) == len(got)  # none published twice
    by_id = {c["command_id"]: c for c in got}
    for command in expected:
        twin = by_id[command["command_id"]]
        for field in ("attempt", "stage", "step", "rule_id", "actions", "dry_run"):
            assert twin[field] == command[field], (field, twin, command)
