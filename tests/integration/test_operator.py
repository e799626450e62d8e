"""`rlpulse control ...` reaches the run's ControlClient and reports its ack; operator
commands that cannot reach Kafka (`control`, `rules publish`) end with one sentence."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from rlpulse.producers import ControlClient
from rlpulse.rules import schema
from rlpulse.schemas.records import AckStatus, ControlCommand
from rlpulse.schemas.topics import Topics
from rlpulse.settings import CommandLimits
from tests.kafka import settings_at

pytestmark = pytest.mark.broker

PRESETS = Path(schema.__file__).with_name("presets")


SHORT_WAIT = {"RLPULSE_OPERATOR__KAFKA_TIMEOUT_S": "2"}
"""For a write that cannot be confirmed: the operator's wait (15 s by default) set to 2 s."""


def control(
    bootstrap: str, topics: Topics, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rlpulse", "control", *args]
    command += ["--bootstrap", bootstrap, "--prefix", topics.prefix]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=os.environ | (env or {}),
    )


def receive(client: ControlClient, want: int, timeout_s: float = 30.0) -> list[ControlCommand]:
    got: list[ControlCommand] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += client.poll(timeout_s=0.2)
    return got


def test_stop_checkpoint_and_scale_reach_the_run(kafka_bootstrap: str, topics: Topics) -> None:
    settings = settings_at(kafka_bootstrap, topics)
    with ControlClient("run-op", settings=settings) as client:
        client.poll()
        scale = control(
            kafka_bootstrap,
            topics,
            "scale",
            "run-op",
            "--factor",
            "0.5",
            "--min",
            "16",
            "--reason",
            "memory pressure",
            "--no-wait",
        )
        assert scale.returncode == 0, scale.stderr
        stop = control(
            kafka_bootstrap, topics, "stop", "run-op", "--reason", "diverging", "--no-wait"
        )
        assert stop.returncode == 0, stop.stderr
        other = control(kafka_bootstrap, topics, "checkpoint", "another-run", "--no-wait")
        assert other.returncode == 0, other.stderr
        commands = receive(client, want=2)
    assert [c["origin"] for c in commands] == ["operator", "operator"]
    assert commands[0]["actions"] == [
        {"type": "scale_rollout_batch", "params": {"factor": 0.5, "min": 16}}
    ]
    assert "memory pressure" in commands[0]["reason"]
    assert [a["type"] for a in commands[1]["actions"]] == ["checkpoint", "stop"]
    assert "diverging" in commands[1]["reason"]
    assert all(c["run_id"] == "run-op" for c in commands)


class Trainer:
    """A run's rank 0 in a thread: polls its commands and acks each with ``status``."""

    def __init__(
        self, bootstrap: str, topics: Topics, status: AckStatus, limits: CommandLimits
    ) -> None:
        self.run_id = f"run-{uuid.uuid4().hex[:8]}"
        settings = settings_at(bootstrap, topics, commands=limits)
        self.client = ControlClient(self.run_id, settings=settings)
        self.status: AckStatus = status
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        step = 0
        while not self.done.is_set():
            step += 1
            for command in self.client.poll(timeout_s=0.2):
                self.client.ack(command, self.status, applied_at_step=step, detail={"by": "test"})

    def __enter__(self) -> Trainer:
        deadline = time.monotonic() + 30
        while not self.client.started and time.monotonic() < deadline:
            self.client.poll(timeout_s=0.2)
        assert self.client.started
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.done.set()
        self.thread.join(10)
        self.client.close()


def test_control_waits_for_the_ack_and_prints_it(kafka_bootstrap: str, topics: Topics) -> None:
    with Trainer(kafka_bootstrap, topics, "applied", CommandLimits()) as trainer:
        result = control(
            kafka_bootstrap, topics, "scale", trainer.run_id, "--factor", "2", "--max", "64",
            "--wait", "30",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    sent, answer = result.stdout.strip().splitlines()
    command_id = sent.split()[1]
    assert answer.startswith(f"run {trainer.run_id} acked {command_id}: applied at step ")
    assert answer.endswith("(by: test)")


def test_a_rejecting_trainer_makes_control_fail_with_its_reason(
    kafka_bootstrap: str, topics: Topics
) -> None:
    """The trainer's limits are its own: a bound this side accepts, it may still reject."""
    with Trainer(kafka_bootstrap, topics, "applied", CommandLimits(max_batch_size=32)) as trainer:
        result = control(
            kafka_bootstrap, topics, "scale", trainer.run_id, "--factor", "2", "--max", "64",
            "--wait", "30",
        )  # fmt: skip
    assert result.returncode == 1, result.stdout
    assert f"run {trainer.run_id} acked" in result.stderr
    assert "rejected (check: contents, reason: refused: action 1" in result.stderr
    assert "max 64 is outside [1, 32] (commands.max_batch_size)" in result.stderr


def test_no_ack_within_the_wait_is_exit_status_2(kafka_bootstrap: str, topics: Topics) -> None:
    result = control(kafka_bootstrap, topics, "stop", "run-nobody", "--wait", "2")
    assert result.returncode == 2, result.stderr
    assert "sent " in result.stdout
    assert "no ack from run run-nobody (attempt 0) within 2 s" in result.stderr


def test_unreachable_broker_is_one_clear_error(topics: Topics) -> None:
    refused = "(Connect to ipv4#127.0.0.1:1 failed: Connection refused)"
    result = control("127.0.0.1:1", topics, "stop", "run-x", "--no-wait", env=SHORT_WAIT)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: could not publish to {topics.control} at 127.0.0.1:1: Kafka did not answer "
        f"within 2 s {refused}"
    ]
    # the ack watch asks first
    waiting = control("127.0.0.1:1", topics, "stop", "run-x", env=SHORT_WAIT)
    assert waiting.returncode == 1
    assert waiting.stderr.splitlines() == [
        f"error: Kafka at 127.0.0.1:1 did not answer within 2 s {refused}; nothing was sent"
    ]


def test_rules_publish_names_the_cause(kafka_bootstrap: str) -> None:
    rules = PRESETS / "seed.yaml"
    unreachable = rlpulse_cli(
        "rules", "publish", str(rules), "--bootstrap", "127.0.0.1:1", env=SHORT_WAIT
    )
    assert unreachable.returncode == 1
    assert unreachable.stderr.splitlines() == [
        "error: could not publish to rlpulse.rules at 127.0.0.1:1: Kafka did not answer within "
        "2 s (Connect to ipv4#127.0.0.1:1 failed: Connection refused)"
    ]
    nowhere = Topics(prefix=f"missing-{uuid.uuid4().hex[:8]}")
    missing = rlpulse_cli(
        "rules",
        "publish",
        str(rules),
        "--bootstrap",
        kafka_bootstrap,
        "--prefix",
        nowhere.prefix,
        env=SHORT_WAIT,
    )
    assert missing.returncode == 1
    assert missing.stderr.splitlines() == [
        f"error: could not publish to {nowhere.rules} at {kafka_bootstrap}: topic "
        f"{nowhere.rules} does not exist (Kafka does not create topics on first use; "
        "`rlpulse worker` creates its prefix's topics when it starts)"
    ]


def rlpulse_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlpulse", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=os.environ | (env or {}),
    )


def test_a_preset_is_published_as_its_text(kafka_bootstrap: str, topics: Topics) -> None:
    from importlib import resources

    from tests.integration.topic_reader import read_until

    command = [sys.executable, "-m", "rlpulse", "rules", "publish", "seed"]
    command += ["--bootstrap", kafka_bootstrap, "--prefix", topics.prefix]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"published seed (3 rules) to {topics.rules}")
    text = resources.files("rlpulse.rules").joinpath("presets", "seed.yaml").read_bytes()
    (record,) = read_until(
        kafka_bootstrap, topics.rules, lambda value: value, lambda got: got != []
    )
    assert record == text
