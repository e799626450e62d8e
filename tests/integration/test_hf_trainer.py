"""Hugging Face: a real ``transformers.Trainer`` (CPU, tiny random GPT-2) with ``RlpulseCallback``.

As one process and as two (gloo, under torchrun): an operator's ``stop`` command
(checkpoint, then stop) makes every rank save and stop at the same step, the ack reports
that step, and the events of both ranks reach Kafka. Resuming from a checkpoint starts a
new run attempt. torch and transformers come from the ``integrations`` extra of pyproject.toml.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rlpulse.ops.commands import action, operator_command, publish_command
from rlpulse.producers import EXIT_STOPPED_BY_RULE
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import CommandAck, TrainerEvent
from rlpulse.schemas.topics import Topics
from tests.integration.test_run_end import run_ends
from tests.integration.topic_reader import read_until
from tests.kafka import settings_at

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "hf_scripts" / "train_until_stopped.py"
RUN_TIMEOUT_S = 240


def command_line(processes: int) -> list[str]:
    if processes == 1:
        return [sys.executable, str(SCRIPT)]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(processes),
        str(SCRIPT),
    ]


def script_args(bootstrap: str, topics: Topics, run_id: str, output: Path) -> list[str]:
    return [
        *("--bootstrap", bootstrap, "--prefix", topics.prefix),
        *("--run-id", run_id, "--output-dir", str(output)),
    ]


def run_to_end(command: list[str]) -> None:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]


@pytest.mark.parametrize("processes", [1, 2])
def test_an_operator_stop_saves_and_stops_every_rank_at_one_step(
    processes: int, kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    run_id = f"hf-{processes}-{uuid.uuid4().hex[:8]}"
    output = tmp_path / "out"
    output.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    trainer = subprocess.Popen(
        command_line(processes) + script_args(kafka_bootstrap, topics, run_id, output),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        codec = default_codec()

        def of_run(event: TrainerEvent) -> bool:
            return event["run_id"] == run_id and event["kind"] == "metrics"

        # Training is under way: rank 0 logged step 3.
        read_until(
            kafka_bootstrap,
            topics.events,
            codec.decode_event,
            lambda found: any(e["stage"] == "trainer" and e["step"] >= 3 for e in found),
            keep=of_run,
            timeout_s=RUN_TIMEOUT_S,
        )
        stop = operator_command(run_id, [action("checkpoint"), action("stop")], reason="test")
        settings = settings_at(kafka_bootstrap, topics)
        publish_command(settings, stop)
        log, _ = trainer.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    assert trainer.returncode == EXIT_STOPPED_BY_RULE, log[-5000:]

    reports = [json.loads((output / f"rank{r}.json").read_text()) for r in range(processes)]
    steps = {report["global_step"] for report in reports}
    assert len(steps) == 1, reports
    (step,) = steps
    assert 3 <= step < 5000
    for report in reports:
        assert report["world_size"] == processes
        assert report["stopped_by"] == stop["command_id"]
        assert report["checkpoints"] == [f"checkpoint-{step}"]
        assert report["attempt"] == 0
    checkpoint = output / f"checkpoint-{step}"
    assert (checkpoint / "model.safetensors").is_file()
    assert json.loads((checkpoint / "rlpulse_attempt.json").read_text())["attempt"] == 0

    def of_stop(ack: CommandAck) -> bool:
        return ack["command_id"] == stop["command_id"]

    (ack,) = read_until(kafka_bootstrap, topics.acks, codec.decode_ack, bool, keep=of_stop)
    assert ack["status"] == "applied"
    assert ack["applied_at_step"] == step
    assert ack["detail"]["checkpoint.path"] == str(checkpoint)
    assert ack["detail"]["stop.stopped_at_step"] == str(step)

    # Each rank reported its own step time for the last step: one group of `processes`.
    events = read_until(
        kafka_bootstrap,
        topics.events,
        codec.decode_event,
        lambda found: any(e["kind"] == "run_end" for e in found),
        keep=lambda event: event["run_id"] == run_id,
    )
    last = [e for e in events if e["stage"] == "rank" and e["step"] == step]
    assert sorted(e["rank"] for e in last) == list(range(processes))
    assert {e["world_size"] for e in last} == {processes}
    assert all(e["metrics"]["step_time_s"] > 0 for e in last)
    logged = [e for e in events if e["stage"] == "trainer" and e["kind"] == "metrics"]
    assert {(e["rank"], e["world_size"]) for e in logged} == {(0, 1)}
    assert "loss" in logged[0]["metrics"] and "grad_norm" in logged[0]["metrics"]
    # on_train_end, exit_if_stopped and close each may end the run: rank 0's first did
    assert run_ends(kafka_bootstrap, topics, run_id) == [
        (0, 0, f"stopped by command {stop['command_id']} (operator)")
    ]


def test_resuming_from_a_checkpoint_starts_a_new_attempt(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    run_id = f"hf-resume-{uuid.uuid4().hex[:8]}"
    base = command_line(1) + script_args(kafka_bootstrap, topics, run_id, tmp_path)
    run_to_end([*base, "--max-steps", "4", "--save-steps", "4"])
    assert json.loads((tmp_path / "checkpoint-4" / "rlpulse_attempt.json").read_text()) == {
        "run_id": run_id,
        "attempt": 0,
    }
    run_to_end([*base, "--max-steps", "6", "--resume"])

    report = json.loads((tmp_path / "rank0.json").read_text())
    assert (report["global_step"], report["attempt"], report["stopped_by"]) == (6, 1, None)
    codec = default_codec()
    events = read_until(
        kafka_bootstrap,
        topics.events,
        codec.decode_event,
        lambda found: sum(e["kind"] == "run_end" for e in found) == 2,
        keep=lambda event: event["run_id"] == run_id,
    )
    ranks = [(e["attempt"], e["step"]) for e in events if e["stage"] == "rank"]
    assert ranks == [(0, 1), (0, 2), (0, 3), (0, 4), (1, 5), (1, 6)]
