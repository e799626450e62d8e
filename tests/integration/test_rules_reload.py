"""Rules reach a running worker through the rules topic; state of unchanged rules survives."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from rlpulse.local.child_process import free_port
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import ControlClient, EventLogger
from rlpulse.schemas.records import ControlCommand
from rlpulse.schemas.topics import RULES_KEY, Topics
from tests.integration.scrape import scrape
from tests.kafka import settings_at

pytestmark = pytest.mark.broker

RULES = """\
version: 1
rules:
  - id: kl-watch
    metric: kl_divergence
    when: "> 0.3"
    for_steps: 3
    actions: [{{checkpoint: {{tag: kl}}}}]
  - id: loss-watch
    metric: loss
    when: "> {loss_threshold}"
    actions: [{{alert: {{severity: warning, message: loss high}}}}]
  - id: loss-dry
    metric: loss
    when: "> 0.5"
    mode: dry_run
    actions: [{{alert: {{severity: info, message: would alert}}}}]
"""


def publish(bootstrap: str, topics: Topics, path: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rlpulse", "rules", "publish", str(path)]
    return subprocess.run(
        [*command, "--bootstrap", bootstrap, "--prefix", topics.prefix],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def wait_for_log(worker: WorkerProcess, text: str, count: int = 1, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if worker.log_file.read_text(errors="replace").count(text) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} x{count} not in the worker log:\n{worker.log_file.read_text()}")


def receive(client: ControlClient, want: int, timeout_s: float = 30.0) -> list[ControlCommand]:
    got: list[ControlCommand] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += client.poll(timeout_s=0.2)
    return got


@pytest.mark.slow
def test_published_edit_takes_effect_and_keeps_unchanged_state(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    first = tmp_path / "rules-v1.yaml"
    first.write_text(RULES.format(loss_threshold=1.0))
    edited = tmp_path / "rules-v2.yaml"
    edited.write_text(RULES.format(loss_threshold=0.8))
    broken = tmp_path / "broken.yaml"
    broken.write_text(RULES.format(loss_threshold="one"))
    assert publish(kafka_bootstrap, topics, first).returncode == 0

    settings = settings_at(kafka_bootstrap, topics)
    worker = WorkerProcess(
        kafka_bootstrap, topics.prefix, tmp_path / "worker.log", rules="topic", partitions=3
    )
    worker.start()
    ranks = [EventLogger("run-r", rank=r, world_size=2, settings=settings) for r in range(2)]
    client = ControlClient("run-r", settings=settings)

    def log_step(step: int, kl: float, loss: float) -> None:
        for logger in ranks:
            logger.log({"kl_divergence": kl, "loss": loss}, step, "actor")
            assert logger.flush(10) == 0

    try:
        worker.wait_consuming()
        wait_for_log(worker, "now in force")
        log_step(1, kl=0.5, loss=0.9)  # kl streak 1; loss 0.9 < 1.0; dry-run fires
        log_step(2, kl=0.5, loss=0.9)  # kl streak 2
        assert receive(client, want=1, timeout_s=5) == []

        result = publish(kafka_bootstrap, topics, edited)
        assert result.returncode == 0, result.stderr
        wait_for_log(worker, "now in force", count=2)
        log_step(3, kl=0.5, loss=0.9)  # kl streak 3 -> fires; loss 0.9 > 0.8 -> fires
        commands = receive(client, want=2)
        assert sorted((c["rule_id"], c["step"]) for c in commands) == [
            ("kl-watch", 3),
            ("loss-watch", 3),
        ]

        refused = publish(kafka_bootstrap, topics, broken)
        assert refused.returncode == 1
        assert "broken.yaml:" in refused.stderr and "not published" in refused.stderr
        with Producer({"bootstrap.servers": kafka_bootstrap}) as raw:
            raw.produce(topics.rules, key=RULES_KEY, value=b"version: 1\nrules: [{id: x}]\n")
            raw.flush(10)
        wait_for_log(worker, "refused rules")
        log_step(4, kl=0.1, loss=0.9)  # the edited rules are still in force
        later = receive(client, want=1)
        assert [(c["rule_id"], c["step"]) for c in later] == [("loss-watch", 4)]
        assert all(not c["dry_run"] for c in commands + later)
        assert {c["rule_id"] for c in client.dry_run_seen} == {"loss-dry"}
        assert all(c["dry_run"] for c in client.dry_run_seen)
    finally:
        for logger in ranks:
            logger.close(10)
        client.close()
        worker.stop()


def test_a_text_refused_at_start_up_is_counted(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    with Producer({"bootstrap.servers": kafka_bootstrap}) as raw:
        raw.produce(topics.rules, key=RULES_KEY, value=b"version: 1\nrules: [{id: x}]\n")
        assert raw.flush(10) == 0
    port = free_port()
    worker = WorkerProcess(
        kafka_bootstrap,
        topics.prefix,
        tmp_path / "worker.log",
        rules=None,  # follow the rules topic, as `rlpulse worker` does by default
        partitions=3,
        extra_args=("--metrics-port", str(port), "--metrics-host", "127.0.0.1"),
    )
    try:
        worker.start()
        worker.wait_consuming(timeout_s=90.0)
        counters = scrape(f"http://127.0.0.1:{port}/metrics")
        assert counters['rlpulse_rules_refused_total{reason="invalid"}'] == 1.0
        assert "refused rules" in worker.log_file.read_text()
    finally:
        worker.stop()
