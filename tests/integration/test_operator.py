"""`rlpulse control ...` reaches the run's ControlClient as an operator command."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rlpulse.producers import ControlClient
from rlpulse.schemas.records import ControlCommand
from rlpulse.schemas.topics import Topics
from tests.kafka import settings_at

pytestmark = pytest.mark.broker


def control(bootstrap: str, topics: Topics, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rlpulse", "control", *args]
    command += ["--bootstrap", bootstrap, "--prefix", topics.prefix]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


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
        )
        assert scale.returncode == 0, scale.stderr
        stop = control(kafka_bootstrap, topics, "stop", "run-op", "--reason", "diverging")
        assert stop.returncode == 0, stop.stderr
        other = control(kafka_bootstrap, topics, "checkpoint", "another-run")
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


def test_unreachable_broker_is_one_clear_error(topics: Topics) -> None:
    result = control("127.0.0.1:1", topics, "stop", "run-x")
    assert result.returncode == 1
    assert "could not publish" in result.stderr


def test_a_preset_is_published_as_its_text(kafka_bootstrap: str, topics: Topics) -> None:
    from importlib import resources

    from tests.integration.topic_reader import read_until

    command = [sys.executable, "-m", "rlpulse", "rules", "publish", "seed"]
    command += ["--bootstrap", kafka_bootstrap, "--prefix", topics.prefix]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"published seed (2 rules) to {topics.rules}")
    text = resources.files("rlpulse.rules").joinpath("presets", "seed.yaml").read_bytes()
    (record,) = read_until(
        kafka_bootstrap, topics.rules, lambda value: value, lambda got: got != []
    )
    assert record == text
