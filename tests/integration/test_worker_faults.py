"""Workers killed mid-run: nothing lost, nothing applied twice, rule state carried over.

(a) one worker is SIGKILLed in the middle of the KL streak, and restarted while later steps
stream in; (b) two workers share six partitions and twenty concurrent runs; one is
SIGKILLed at the same point and the other takes over its partitions with their table state.

The kill lands where the test says: after the rule state of step 51 (the streak's second
step) is on the changelog and the offsets of everything produced so far, up to three of the
four ranks of step 52, are committed (tests/integration/worker_state.py reads both). In
both, every StepSummary arrives, kl-guard fires at step 52 exactly once (its consecutive
count of steps 50-51 survived the crash), unstable-reward at step 30, and each trainer
applies each command exactly once (one ack per command id).
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest

from rlpulse.local.broker import tail
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.transport.topics import ensure_topics
from tests.integration.scripted_run import (
    KL_GUARD_STEP,
    STEPS,
    PacedRuns,
    ScriptedRun,
    by_run,
    consume_all,
    dead_letters,
    log_tails,
    until_ids,
)
from tests.integration.test_pipeline import (
    EXPECTED_SUMMARIES,
    assert_every_step_summarised,
    assert_seed_commands,
)
from tests.integration.worker_state import (
    kl_guard_streak,
    kl_guard_streaks,
    wait_until_durable,
)
from tests.kafka import read_to_end, settings_at

pytestmark = [pytest.mark.broker, pytest.mark.slow]

GRACE_S = 120.0
"""Long: step 52 must stay open, three ranks in, until the kill and beyond (no rank is late)."""


def start_worker(bootstrap: str, topics: Topics, log: Path, partitions: int) -> WorkerProcess:
    worker = WorkerProcess(
        bootstrap,
        topics.prefix,
        log,
        rules="seed",
        partitions=partitions,
        grace_s=GRACE_S,
        data_dir=log.with_suffix(".data"),
        extra_args=("--log-level", "info"),
    )
    return worker.start()


def assert_runs_complete(
    bootstrap: str, topics: Topics, runs: list[ScriptedRun], logs: str
) -> None:
    """For every run: every step summarised once per id, the seed commands at their steps,
    each applied once (one ack each) and nothing else on the control topic."""
    codec = default_codec()
    want = {run.run_id: EXPECTED_SUMMARIES for run in runs}
    until_summaries = until_ids(want, codec.decode_summary, "summary_id")
    until_acks = until_ids(dict.fromkeys(want, 2), codec.decode_ack, "command_id")
    summaries = by_run(
        consume_all(bootstrap, topics.steps, until_summaries, 120.0), codec.decode_summary
    )
    acks = by_run(consume_all(bootstrap, topics.acks, until_acks, 30.0), codec.decode_ack)
    on_topic = by_run(
        [m.value() for m in read_to_end(bootstrap, topics.control)], codec.decode_command
    )
    for run in runs:
        try:
            assert_every_step_summarised(summaries.get(run.run_id, []), all_complete=False)
            assert_seed_commands(run)
        except AssertionError as exc:
            raise AssertionError(
                f"{run.run_id}: {exc}\n{dead_letters(bootstrap, topics)}\n{logs}"
            ) from exc
        assert sorted((a["command_id"], a["status"]) for a in acks.get(run.run_id, [])) == sorted(
            (c["command_id"], "applied") for c in run.received
        ), f"{run.run_id}: acks {acks.get(run.run_id)}"
        commands = {c["command_id"] for c in on_topic.get(run.run_id, [])}
        assert commands == {c["command_id"] for c in run.received}


def test_sigkill_mid_run_then_restart(kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    """SIGKILL once the streak of steps 50-51 is durable and 3 of 4 ranks of step 52 (the
    streak's third step) are read and committed: the restarted worker must complete step 52
    from the durable state, and kl-guard fire there exactly once."""
    worker = start_worker(kafka_bootstrap, topics, tmp_path / "worker-1.log", partitions=3)
    run = ScriptedRun(kafka_bootstrap, topics)
    logs: list[Path] = [worker.log_file]
    try:
        worker.wait_consuming(timeout_s=90.0)
        run.log_steps(range(1, KL_GUARD_STEP))
        run.log_steps([KL_GUARD_STEP], ranks=range(3))  # rank 3 of step 52 still to come
        group = worker.group_id
        wait_until_durable(
            kafka_bootstrap, topics, group, [run.run_id], "actor", KL_GUARD_STEP - 1, 3
        )
        assert kl_guard_streak(kafka_bootstrap, group, run.run_id) == 2
        assert worker.stop(signal.SIGKILL) == -signal.SIGKILL
        pacer = PacedRuns([run], pause_s=0.05, steps=range(KL_GUARD_STEP + 1, STEPS + 1))
        run.log_steps([KL_GUARD_STEP], ranks=[3])
        pacer.start()  # later steps stream in while the worker restarts
        worker = start_worker(kafka_bootstrap, topics, tmp_path / "worker-2.log", partitions=3)
        logs.append(worker.log_file)
        pacer.join(60.0)
        assert pacer.error is None, pacer.error
        run.receive_commands(want=2, timeout_s=120.0)
        assert worker.alive(), tail(worker.log_file, 40)
        assert_runs_complete(kafka_bootstrap, topics, [run], log_tails(logs))
    finally:
        run.close()
        worker.stop()


@pytest.mark.timeout(600)
def test_two_workers_one_killed_the_other_takes_over(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Twenty runs on two workers; worker A is SIGKILLed once every run's streak of steps
    50-51 is durable and 3 of 4 ranks of step 52 are committed. Worker B takes A's
    partitions over with their table state: every run gets kl-guard once, at step 52."""
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    ensure_topics(settings_at(kafka_bootstrap), topics, partitions=6)
    workers = [
        start_worker(kafka_bootstrap, topics, tmp_path / f"worker-{name}.log", partitions=6)
        for name in ("a", "b")
    ]
    logs = [w.log_file for w in workers]
    runs = [ScriptedRun(kafka_bootstrap, topics) for _ in range(20)]
    try:
        for worker in workers:
            worker.wait_consuming(timeout_s=120.0)
        _wait_for_members(workers[0], want=2, timeout_s=60.0)
        for run in runs:
            run.log_steps(range(1, KL_GUARD_STEP))
            run.log_steps([KL_GUARD_STEP], ranks=range(3))
        group = workers[0].group_id
        run_ids = [run.run_id for run in runs]
        wait_until_durable(
            kafka_bootstrap, topics, group, run_ids, "actor", KL_GUARD_STEP - 1, 6, timeout_s=240.0
        )
        assert set(kl_guard_streaks(kafka_bootstrap, group, run_ids).values()) == {2}
        assert workers[0].stop(signal.SIGKILL) == -signal.SIGKILL
        for run in runs:
            run.log_steps([KL_GUARD_STEP], ranks=[3])
        for step in range(KL_GUARD_STEP + 1, STEPS + 1):  # every run's step, then the next
            for run in runs:
                run.log_steps([step], flush=False)
        for run in runs:
            run.flush()
        deadline = time.monotonic() + 300.0  # session timeout, rebalance, recovery, backlog
        pending = list(runs)
        while pending and time.monotonic() < deadline:
            for run in pending:
                run.receive_commands(want=2, timeout_s=0.5, settle_s=0.0)
            pending = [run for run in pending if len(run.received) < 2]
        for run in runs:  # a command that comes twice would show up here
            run.receive_commands(want=0, timeout_s=0.0, settle_s=0.5)
        assert workers[1].alive(), tail(workers[1].log_file, 40)
        assert_runs_complete(kafka_bootstrap, topics, runs, log_tails(logs))
    finally:
        for run in runs:
            run.close()
        for worker in workers:
            worker.stop()


def _wait_for_members(worker: WorkerProcess, want: int, timeout_s: float) -> None:
    from rlpulse.transport.clients import new_admin

    admin = new_admin(settings_at(worker.bootstrap))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        group = admin.describe_consumer_groups([worker.group_id])[worker.group_id].result()
        if str(group.state).endswith("STABLE") and len(group.members) >= want:
            return
        time.sleep(0.5)
    raise TimeoutError(f"group {worker.group_id} never had {want} members")
