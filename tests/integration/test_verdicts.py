"""Verdicts on the real broker: did the seed rules' doubling of the rollout batch work?

A worker with the seed rules (unstable-reward expects the variance of 5 steps after the
applied step to be back at or below 0.5 within 10 steps) watches runs whose trainers apply
the commands they get and acknowledge them at the step they applied them:

- a run whose reward calms down once its batch doubled: ``effective``, 5 steps after the
  applied step (the first full window of values after it);
- the demo's run (``rlpulse demo``'s own loop): its reward keeps swinging whatever the batch,
  so both doublings are ``ineffective`` when their 10 steps run out, and the third firing,
  a ``noop`` at the cap, is ``unknown``;
- a run that ends 2 steps after its doubling was applied: ``unknown``;
- a worker SIGKILLed inside a window and restarted: the verdict comes once, from the
  restarted worker.

In each, ``rlpulse rules backtest``'s function over the same events and acks (read back from
the topics) gives the same verdicts.
"""

from __future__ import annotations

import io
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from rich.console import Console

from rlpulse.local.demo import play
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.offline.backtest import RecordedEvent, run_backtest
from rlpulse.producers import ControlClient, EventLogger
from rlpulse.rules import load_preset
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import AckStatus, ActionVerdict, CommandAck, ControlCommand
from rlpulse.schemas.topics import Topics
from rlpulse.settings import JoinerSettings, Settings
from tests.kafka import read_all, read_to_end, settings_at

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(600)]

RANKS = 4
STEP_S = 0.15
GRACE_S = 5.0
SWING_FROM = 3
COMPARED = ("verdict_id", "command_id", "verdict", "applied_at_step", "decided_at_step", "value")


class ReactingRun:
    """A trainer of ``RANKS`` ranks whose reward depends on its rollout batch.

    Each step every rank logs ``reward(step, batch)`` (stage rollout) and a calm KL (stage
    actor); then rank 0 polls its commands, doubles the batch (cap 256) and acks each
    ``applied`` at this step (``noop`` at the cap).
    """

    def __init__(self, settings: Settings, reward: Callable[[int, int], float]) -> None:
        self.run_id = f"verdicts-{uuid.uuid4().hex[:8]}"
        self.reward = reward
        self.batch = 64
        self.ranks = [
            EventLogger(self.run_id, rank=rank, world_size=RANKS, settings=settings)
            for rank in range(RANKS)
        ]
        self.control = ControlClient(self.run_id, settings=settings)
        self.applied: list[tuple[ControlCommand, int]] = []

    def play(self, last_step: int, until: Callable[[ReactingRun, int], bool] | None = None) -> int:
        """Log steps 1..``last_step`` (or until ``until(self, step)``), then end the run."""
        step = 0
        try:
            for step in range(1, last_step + 1):
                for logger in self.ranks:
                    logger.log({"reward_mean": self.reward(step, self.batch)}, step=step,
                               stage="rollout")  # fmt: skip
                    logger.log({"kl_divergence": 0.05}, step=step, stage="actor")
                for logger in self.ranks:
                    logger.flush(timeout_s=10.0)
                time.sleep(STEP_S)
                for command in self.control.poll(timeout_s=0.05):
                    old, self.batch = self.batch, min(self.batch * 2, 256)
                    status: AckStatus = "applied" if self.batch != old else "noop"
                    self.control.ack(command, status, applied_at_step=step)
                    self.applied.append((command, step))
                if until is not None and until(self, step):
                    break
        finally:
            self.ranks[0].run_end(step)
            for logger in self.ranks:
                logger.close(timeout_s=10.0)
            self.control.close()
        return step


def swinging_until_doubled(step: int, batch: int) -> float:
    """Reward 1.0, swinging by +-1.5 from step 3 while the batch is 64, calm once doubled."""
    if step < SWING_FROM or batch > 64:
        return 1.0
    return 2.5 if step % 2 else -0.5


def always_swinging(step: int, batch: int) -> float:
    """Reward swinging by +-1.5 from step 3, whatever the batch."""
    return 1.0 if step < SWING_FROM else (2.5 if step % 2 else -0.5)


def verdicts_of(bootstrap: str, topics: Topics, run_id: str, count: int) -> list[ActionVerdict]:
    """The run's verdicts on the verdicts topic, once ``count`` distinct ids are there."""
    codec = default_codec()

    def mine(messages: list[Any]) -> list[ActionVerdict]:
        found = [codec.decode_verdict(m.value()) for m in messages]
        return [v for v in found if v["run_id"] == run_id]

    messages = read_all(
        bootstrap, topics.verdicts, lambda ms: len({v["verdict_id"] for v in mine(ms)}) >= count,
        timeout_s=90,
    )  # fmt: skip
    # A moment more: a second copy of a verdict would show up here.
    messages += read_all(bootstrap, topics.verdicts, lambda _ms: False, timeout_s=2)[
        len(messages) :
    ]
    return mine(messages)


def backtest_verdicts(bootstrap: str, topics: Topics, run_id: str) -> list[ActionVerdict]:
    """The backtest's verdicts over the run's events and acks, read back from the topics."""
    codec = default_codec()
    events = [codec.decode_event(m.value()) for m in read_to_end(bootstrap, topics.events)]
    acks: dict[str, CommandAck] = {}
    for message in read_to_end(bootstrap, topics.acks):
        ack = codec.decode_ack(message.value())
        if ack["run_id"] == run_id:
            acks.setdefault(ack["command_id"], ack)
    recorded = [RecordedEvent(e) for e in events if e["run_id"] == run_id]
    result = run_backtest(load_preset("seed"), recorded, JoinerSettings(grace_s=GRACE_S), acks)
    return result.verdicts


def compared(verdicts: list[ActionVerdict]) -> list[tuple[Any, ...]]:
    """What must agree between the worker's verdicts and the backtest's (not emitted_ns)."""
    rows = [cast(dict[str, Any], v) for v in verdicts]
    return sorted(
        (*(v[k] for k in COMPARED), sorted(v["evidence"].items()), v["reason"]) for v in rows
    )


@pytest.fixture
def worker(kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> WorkerProcess:
    process = WorkerProcess(
        kafka_bootstrap, topics.prefix, tmp_path / "worker.log", partitions=3, grace_s=GRACE_S
    )
    return process


def test_a_doubling_that_calms_the_reward_is_effective_five_steps_after_it_was_applied(
    kafka_bootstrap: str, topics: Topics, worker: WorkerProcess
) -> None:
    with worker:
        worker.wait_consuming(timeout_s=90)
        run = ReactingRun(settings_at(kafka_bootstrap, topics), swinging_until_doubled)
        run.play(40)
        (verdict,) = verdicts_of(kafka_bootstrap, topics, run.run_id, 1)
    print(
        f"verdict: {verdict['verdict']} at step {verdict['decided_at_step']}: {verdict['reason']}"
    )
    (command, applied), *_ = run.applied
    assert len(run.applied) == 1, [c["step"] for c, _ in run.applied]
    assert verdict["command_id"] == command["command_id"]
    assert verdict["verdict"] == "effective", verdict["reason"]
    assert verdict["applied_at_step"] == applied
    assert verdict["decided_at_step"] == applied + 5
    assert verdict["value"] == 0.0
    assert compared(backtest_verdicts(kafka_bootstrap, topics, run.run_id)) == compared([verdict])


def test_the_demos_doublings_are_ineffective_and_its_noop_unknown(
    kafka_bootstrap: str, topics: Topics, worker: WorkerProcess, tmp_path: Path
) -> None:
    settings = settings_at(kafka_bootstrap, topics)
    run_id = f"demo-{uuid.uuid4().hex[:6]}"
    out = io.StringIO()
    with worker:
        worker.wait_consuming(timeout_s=90)
        assert play(Console(file=out), settings, tmp_path, worker.alive, 0.15, run_id) == 0, (
            out.getvalue()
        )
        live = verdicts_of(kafka_bootstrap, topics, run_id, 3)
    by_step = sorted(live, key=lambda v: v["issued_step"])
    for verdict in by_step:
        print(f"issued at {verdict['issued_step']}: {verdict['verdict']}: {verdict['reason']}")
    kinds = [v["verdict"] for v in by_step]
    assert kinds[:2] == ["ineffective", "ineffective"], [v["reason"] for v in by_step]
    assert len(kinds) >= 3 and set(kinds[2:]) == {"unknown"}, [v["reason"] for v in by_step]
    for verdict in by_step[:2]:
        applied = verdict["applied_at_step"]
        assert applied is not None
        assert verdict["decided_at_step"] == applied + 10
        assert len(verdict["evidence"]) == 6  # windows ending at applied+5 .. applied+10
        assert all(value > 0.5 for value in verdict["evidence"].values())
    assert by_step[2]["reason"].startswith(
        "the command was not applied: the trainer acknowledged it noop"
    )
    assert compared(backtest_verdicts(kafka_bootstrap, topics, run_id)) == compared(live)


def test_a_run_that_ends_inside_the_window_gets_unknown(
    kafka_bootstrap: str, topics: Topics, worker: WorkerProcess
) -> None:
    def two_steps_after_the_doubling(run: ReactingRun, step: int) -> bool:
        return bool(run.applied) and step >= run.applied[0][1] + 2

    with worker:
        worker.wait_consuming(timeout_s=90)
        run = ReactingRun(settings_at(kafka_bootstrap, topics), always_swinging)
        last = run.play(40, until=two_steps_after_the_doubling)
        (verdict,) = verdicts_of(kafka_bootstrap, topics, run.run_id, 1)
    print(f"verdict: {verdict['verdict']}: {verdict['reason']}")
    applied = run.applied[0][1]
    assert verdict["verdict"] == "unknown"
    assert verdict["reason"] == (
        f"the run attempt ended at step {last} before 10 steps had passed after its applied "
        f"step {applied}"
    )
    assert compared(backtest_verdicts(kafka_bootstrap, topics, run.run_id)) == compared([verdict])


def test_a_worker_killed_inside_a_window_publishes_the_verdict_once(
    kafka_bootstrap: str, topics: Topics, worker: WorkerProcess
) -> None:
    killed: list[tuple[int, int]] = []  # (step, time.time_ns())

    def kill_then_restart(run: ReactingRun, step: int) -> bool:
        if run.applied and not killed and step >= run.applied[0][1] + 2:
            worker.stop(signal.SIGKILL)
            killed.append((step, time.time_ns()))
            worker.start()
        return False

    with worker:
        worker.wait_consuming(timeout_s=90)
        run = ReactingRun(settings_at(kafka_bootstrap, topics), swinging_until_doubled)
        run.play(30, until=kill_then_restart)
        copies = verdicts_of(kafka_bootstrap, topics, run.run_id, 1)
    (command, applied), *_ = run.applied
    print(f"applied at {applied}, worker killed at step {killed[0][0]}; copies: {len(copies)}")
    for copy in copies:
        print(f"  issued at {copy['issued_step']}: {copy['verdict']}: {copy['reason']}")
    assert len(run.applied) == 1
    assert killed[0][0] < applied + 5  # before the step that decides it
    assert len(copies) == 1
    (verdict,) = copies
    assert verdict["command_id"] == command["command_id"]
    assert verdict["emitted_ns"] > killed[0][1]  # decided by the restarted worker
    assert (verdict["verdict"], verdict["decided_at_step"]) == ("effective", applied + 5)
    assert compared(backtest_verdicts(kafka_bootstrap, topics, run.run_id)) == compared(copies)
