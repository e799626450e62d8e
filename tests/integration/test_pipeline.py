"""The whole path on the real broker with a real worker process: trainer -> worker -> trainer."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from rlpulse.local.broker import tail
from rlpulse.local.child_process import free_port
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.schemas.records import StepSummary
from rlpulse.schemas.topics import Topics
from tests.integration.scrape import listening_addresses, scrape
from tests.integration.scripted_run import (
    KL_GUARD_STEP,
    RANKS,
    STAGES,
    STEPS,
    UNSTABLE_REWARD_STEP,
    ScriptedRun,
    acks_of,
    commands_on_topic,
    summaries_of,
)
from tests.integration.worker_state import kl_guard_streak, wait_until_durable

pytestmark = pytest.mark.broker

EXPECTED_SUMMARIES = STEPS * len(STAGES)


def start_worker(
    bootstrap: str, topics: Topics, log: Path, *extra: str, grace_s: float = 5.0
) -> WorkerProcess:
    worker = WorkerProcess(
        bootstrap,
        topics.prefix,
        log,
        rules="seed",
        partitions=3,
        grace_s=grace_s,
        extra_args=("--log-level", "info", *extra),
    )
    worker.start()
    worker.wait_consuming(timeout_s=90.0)
    return worker


def assert_seed_commands(run: ScriptedRun) -> None:
    by_rule = Counter(c["rule_id"] for c in run.received)
    assert by_rule == {"unstable-reward": 1, "kl-guard": 1}, run.received
    assert len({c["command_id"] for c in run.received}) == len(run.received)
    unstable = next(c for c in run.received if c["rule_id"] == "unstable-reward")
    guard = next(c for c in run.received if c["rule_id"] == "kl-guard")
    assert (unstable["stage"], unstable["step"]) == ("rollout", UNSTABLE_REWARD_STEP)
    assert unstable["actions"] == [
        {"type": "scale_rollout_batch", "params": {"factor": 2.0, "max": 256}}
    ]
    assert (guard["stage"], guard["step"]) == ("actor", KL_GUARD_STEP)
    assert [a["type"] for a in guard["actions"]] == ["checkpoint", "stop"]
    assert "0.5" in guard["reason"] and "0.3" in guard["reason"]


def assert_every_step_summarised(summaries: list[StepSummary], *, all_complete: bool) -> None:
    """Every step has a summary whose final revision holds all ranks; re-sends keep their id.

    With ``all_complete`` the first revision must already hold every rank (no rank was late).
    """
    final: dict[tuple[str, int], StepSummary] = {}
    for s in summaries:
        key = (s["stage"], s["step"])
        if key not in final or s["revision"] > final[key]["revision"]:
            final[key] = s
    assert set(final) == {(stage, step) for stage in STAGES for step in range(1, STEPS + 1)}
    for summary in final.values():
        assert summary["ranks_reported"] == [0, 1, 2, 3], (
            f"{summary['stage']} step {summary['step']}: ranks {summary['ranks_reported']} in "
            f"its last revision ({summary['revision']}, closed by {summary['closed_by']})"
        )
        assert summary["missing_ranks"] == []
        if all_complete:
            assert (summary["revision"], summary["closed_by"]) == (1, "complete"), summary
    # A summary published twice (re-sent after a takeover) carries the same id.
    ids: dict[tuple[str, int, int], set[str]] = {}
    for s in summaries:
        ids.setdefault((s["stage"], s["step"], s["revision"]), set()).add(s["summary_id"])
    assert all(len(same) == 1 for same in ids.values())


def test_four_ranks_sixty_steps(kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    port = free_port()
    worker = start_worker(
        kafka_bootstrap, topics, tmp_path / "worker.log", "--metrics-port", str(port)
    )
    run = ScriptedRun(kafka_bootstrap, topics)
    try:
        run.log_steps(range(1, STEPS + 1))
        run.receive_commands(want=2, timeout_s=90.0)
        summaries = summaries_of(
            kafka_bootstrap, topics, run.run_id, EXPECTED_SUMMARIES, timeout_s=60.0
        )
        acks = acks_of(kafka_bootstrap, topics, run.run_id, want=2, timeout_s=30.0)
        listening = listening_addresses(worker)
        counters = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        run.close()
        worker.stop()
    # /metrics listens on every interface by default (a Prometheus elsewhere can scrape it)
    assert ("0.0.0.0", port) in listening
    events = RANKS * len(STAGES) * STEPS
    assert counters["rlpulse_events_total"] == events
    assert counters['rlpulse_step_summaries_total{closed_by="complete"}'] == EXPECTED_SUMMARIES
    assert counters["rlpulse_step_join_seconds_count"] == EXPECTED_SUMMARIES
    for rule in ("kl-guard", "unstable-reward"):
        assert counters[f'rlpulse_commands_total{{dry_run="false",rule_id="{rule}"}}'] == 1
    assert counters["rlpulse_duplicate_events_total"] == 0
    assert not [name for name in counters if name.startswith("rlpulse_dead_letters_total{")]
    assert len(summaries) == EXPECTED_SUMMARIES
    assert_every_step_summarised(summaries, all_complete=True)
    rollout_30 = next(s for s in summaries if (s["stage"], s["step"]) == ("rollout", 30))
    assert rollout_30["metrics"]["reward_mean"]["mean"] == 3.0
    assert rollout_30["metrics"]["rank_time_s"]["max_rank"] == 3
    assert_seed_commands(run)
    assert sorted((a["command_id"], a["status"]) for a in acks) == sorted(
        (c["command_id"], "applied") for c in run.received
    )


def test_a_rank_that_never_reports_is_closed_by_grace(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Rank 3 never logs step 5: both stages' step 5 close by grace with rank 3 missing, and
    the steps after it, complete already, leave after it, in order."""
    port = free_port()
    worker = start_worker(
        kafka_bootstrap, topics, tmp_path / "worker.log", "--metrics-port", str(port), grace_s=2.0
    )
    run = ScriptedRun(kafka_bootstrap, topics)
    try:
        run.log_steps(range(1, 5))
        run.log_steps([5], ranks=range(3))
        run.log_steps(range(6, 11))
        summaries = summaries_of(kafka_bootstrap, topics, run.run_id, 20, timeout_s=60.0)
        counters = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        run.close()
        worker.stop()
    by_stage = {stage: [s for s in summaries if s["stage"] == stage] for stage in STAGES}
    for stage, emitted in by_stage.items():
        assert [s["step"] for s in emitted] == list(range(1, 11)), stage  # in step order
        five = emitted[4]
        assert (five["closed_by"], five["missing_ranks"], five["ranks_reported"]) == (
            "grace",
            [3],
            [0, 1, 2],
        )
        assert five["emitted_ns"] - five["first_event_ns"] >= 2 * 10**9  # waited the grace
        assert all(s["closed_by"] == "complete" for s in emitted if s["step"] != 5)
    assert counters['rlpulse_step_summaries_total{closed_by="grace"}'] == 2
    assert counters["rlpulse_events_total"] == RANKS * len(STAGES) * 10 - 2


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
@pytest.mark.slow
def test_worker_restart_mid_run_loses_nothing_and_repeats_nothing(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, sig: signal.Signals
) -> None:
    """Stop the worker once the KL streak of steps 50, 51 is durable (its rule state on the
    changelog, its events' offsets committed); the restarted one completes the streak."""
    worker = start_worker(kafka_bootstrap, topics, tmp_path / "worker-1.log")
    run = ScriptedRun(kafka_bootstrap, topics)
    try:
        run.log_steps(range(1, KL_GUARD_STEP))  # up to step 51: kl streak is 50, 51
        run.receive_commands(want=1, timeout_s=60.0, settle_s=0.0)
        group = worker.group_id
        wait_until_durable(
            kafka_bootstrap, topics, group, [run.run_id], "actor", KL_GUARD_STEP - 1, 3
        )
        assert kl_guard_streak(kafka_bootstrap, group, run.run_id) == 2  # inside the streak
        code = worker.stop(sig)
        if sig is signal.SIGTERM:  # a clean exit, not a SIGKILL after the stop timeout
            assert (code, worker.killed_after_timeout) == (0, False), tail(worker.log_file, 40)
        else:
            assert code == -signal.SIGKILL
        run.log_steps(range(KL_GUARD_STEP, STEPS + 1))  # logged while no worker runs
        worker = start_worker(kafka_bootstrap, topics, tmp_path / "worker-2.log")
        run.receive_commands(want=2, timeout_s=90.0)
        summaries = summaries_of(
            kafka_bootstrap,
            topics,
            run.run_id,
            EXPECTED_SUMMARIES,
            timeout_s=60.0,
            settle_s=10.0,
            whole=True,  # a late rank's revision comes when it does: wait for it
        )
    finally:
        run.close()
        worker.stop()
    # Events logged while no worker ran may reach the new worker with some ranks seconds
    # behind the others (seen under CI load); a rank arriving after the grace period yields a
    # revision, so the final revision of every step must hold all ranks.
    assert_every_step_summarised(summaries, all_complete=False)
    assert_seed_commands(run)
    on_topic = commands_on_topic(kafka_bootstrap, topics, run.run_id)
    # Re-published commands are byte-for-byte the same command: the trainer dedupes them.
    assert {c["command_id"] for c in on_topic} == {c["command_id"] for c in run.received}
