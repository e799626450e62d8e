"""The exporter's pure state: names, collisions, caps, expiry, lookback, latest values."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlpulse.rules.arith import zscore
from rlpulse.schemas.records import ActionVerdict
from rlpulse.settings import ExporterSettings
from rlpulse.streams.exporter.collector import ExporterCollector, reserved_names
from rlpulse.streams.exporter.naming import sanitise
from rlpulse.streams.exporter.state import ExporterState, LogTally
from tests.unit.exporter_records import T0, S, ack, command, event, stats, summary


def new_state(**settings: Any) -> ExporterState:
    return ExporterState(ExporterSettings(**settings), reserved=reserved_names())


def exposition(state: ExporterState) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(state, threading.Lock()))
    return generate_latest(registry).decode()


def samples(state: ExporterState) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition(state))
        for sample in family.samples
    }


def value(state: ExporterState, family: str, /, **labels: str) -> float | None:
    return samples(state).get((family, frozenset(labels.items())))


def names_of(state: ExporterState, prefix: str) -> set[str]:
    return {name for name, _labels in samples(state) if name.startswith(prefix)}


@pytest.mark.parametrize(
    ("logged", "exported"),
    [
        ("reward_mean", "reward_mean"),
        ("actor/pg_loss", "actor_pg_loss"),
        ("critic/score/mean", "critic_score_mean"),
        ("response_length/clip_ratio", "response_length_clip_ratio"),
        ("a.b-c d", "a_b_c_d"),
        ("tokens:total", "tokens_total"),
        ("//leading/and/trailing//", "leading_and_trailing"),
        ("9lives", "9lives"),
        ("ünïcode", "n_code"),
        ("🙂", ""),
    ],
)
def test_sanitise_follows_prometheus_name_rules(logged: str, exported: str) -> None:
    assert sanitise(logged) == exported


def test_namespace_verl_gives_the_seed_exposition() -> None:
    state = new_state(namespace="verl")
    state.add_event(event(0, 7, {"reward_mean": 2.34}), live=True)
    state.add_event(event(1, 7, {"reward_mean": 2.31}), live=True)
    lines = exposition(state).splitlines()
    assert lines[:4] == [
        "# HELP verl_reward_mean Average reward per rollout step",
        "# TYPE verl_reward_mean gauge",
        'verl_reward_mean{rank="0",run="r1",stage="rollout"} 2.34',
        'verl_reward_mean{rank="1",run="r1",stage="rollout"} 2.31',
    ]


def test_seed_metrics_have_their_own_help_and_the_rest_a_generic_one() -> None:
    state = new_state(namespace="verl")
    logged = {"kl_divergence": 0.1, "actor_loss": 0.5, "critic_loss": 0.7, "actor/pg_clipfrac": 0.2}
    state.add_event(event(0, 1, logged), live=True)
    helps = dict(
        line.split(" ", 3)[2:]
        for line in exposition(state).splitlines()
        if line.startswith("# HELP verl_")
    )
    assert helps == {
        "verl_kl_divergence": "KL divergence between the policy and the reference policy",
        "verl_actor_loss": "Actor (policy) loss",
        "verl_critic_loss": "Critic (value function) loss",
        "verl_actor_pg_clipfrac": "Latest actor/pg_clipfrac logged by each rank",
    }


def test_names_ending_in_total_are_counters() -> None:
    state = new_state(namespace="verl")
    state.add_event(event(0, 1, {"tokens_total": 1024.0, "tokens": 8.0}, stage="system"), live=True)
    text = exposition(state)
    assert "# TYPE verl_tokens_total counter" in text
    assert 'verl_tokens_total{rank="0",run="r1",stage="system"} 1024.0' in text
    # `tokens` (a gauge) is the OpenMetrics family `verl_tokens` the counter already owns.
    assert "verl_tokens{" not in text
    assert state.dropped["collision"] == 1


def test_a_collision_after_sanitising_is_reported_not_merged() -> None:
    state = new_state(namespace="verl")
    state.add_event(event(0, 1, {"actor/loss": 1.0, "actor.loss": 2.0, "actor_loss": 3.0}), True)
    state.add_event(event(0, 2, {"actor.loss": 4.0}), live=True)
    assert value(state, "verl_actor_loss", run="r1", stage="rollout", rank="0") == 1.0
    assert state.dropped["collision"] == 3
    assert (
        value(
            state,
            "rlpulse_exporter_name_collision_info",
            name="verl_actor_loss",
            metric="actor.loss",
            kept="actor/loss",
        )
        == 1.0
    )
    assert (
        value(
            state,
            "rlpulse_exporter_name_collision_info",
            name="verl_actor_loss",
            metric="actor_loss",
            kept="actor/loss",
        )
        == 1.0
    )
    assert value(state, "rlpulse_exporter_dropped_samples_total", reason="collision") == 3.0


def test_a_metric_named_like_one_of_the_exporters_own_families_is_a_collision() -> None:
    state = new_state(namespace="rlpulse")
    state.add_event(event(0, 1, {"step_mean": 1.0, "run_attempt": 2.0, "loss": 3.0}), live=True)
    assert names_of(state, "rlpulse_loss") == {"rlpulse_loss"}
    assert value(state, "rlpulse_step_mean", run="r1", stage="rollout", rank="0") is None
    assert state.dropped["collision"] == 2
    kept = {c.metric: c.kept for c in state.names.collisions.values()}
    assert kept == {"step_mean": "(exporter)", "run_attempt": "(exporter)"}


def test_a_name_with_nothing_left_after_sanitising_is_dropped_and_counted() -> None:
    state = new_state(namespace="verl")
    state.add_event(event(0, 1, {"🙂": 1.0, "ok": 2.0}), live=True)
    assert names_of(state, "verl_") == {"verl_ok"}
    assert state.dropped["unnamable"] == 1


def test_the_allow_list_limits_per_rank_series_and_counts_the_rest() -> None:
    state = new_state(namespace="verl", allow_metrics=["reward_*", "actor/*"])
    state.add_event(
        event(0, 1, {"reward_mean": 1.0, "actor/pg_loss": 2.0, "critic/vf_loss": 3.0}), live=True
    )
    assert names_of(state, "verl_") == {"verl_reward_mean", "verl_actor_pg_loss"}
    assert state.dropped["not_allowed"] == 1
    # Summaries are not per rank: every metric keeps its across-ranks series.
    state.add_summary(summary(1, {"critic/vf_loss": stats([3.0])}))
    assert (
        value(state, "rlpulse_step_mean", run="r1", stage="rollout", metric="critic/vf_loss") == 3.0
    )


def test_the_series_cap_drops_new_series_counts_them_and_keeps_updating_the_old() -> None:
    state = new_state(namespace="verl", max_series=5)
    for rank in range(2):
        state.add_event(event(rank, 1, {"a": 1.0, "b": 1.0, "c": 1.0}), live=True)
    assert state.series == 5
    assert state.dropped["cap"] == 1
    assert value(state, "rlpulse_exporter_series") == 5.0
    state.add_event(event(0, 2, {"a": 9.0}), live=True)
    assert value(state, "verl_a", run="r1", stage="rollout", rank="0") == 9.0
    # Summary series count too: a metric's six would pass the cap.
    state.add_summary(summary(2, {"a": stats([9.0])}))
    assert value(state, "rlpulse_step_mean", run="r1", stage="rollout", metric="a") is None
    assert state.dropped["cap"] == 2


def test_latest_value_is_the_newest_step_not_the_last_arrival() -> None:
    state = new_state(namespace="verl")
    state.add_event(event(0, 10, {"reward_mean": 1.0}), live=True)
    state.add_event(event(0, 9, {"reward_mean": 5.0}), live=True)  # a replayed older step
    assert value(state, "verl_reward_mean", run="r1", stage="rollout", rank="0") == 1.0
    state.add_event(event(0, 3, {"reward_mean": 2.0}, attempt=1), live=True)  # resumed run
    assert value(state, "verl_reward_mean", run="r1", stage="rollout", rank="0") == 2.0
    assert value(state, "rlpulse_run_attempt", run="r1") == 1.0
    state.add_event(event(0, 11, {"reward_mean": 7.0}, attempt=0), live=True)  # old attempt
    assert value(state, "verl_reward_mean", run="r1", stage="rollout", rank="0") == 2.0


def test_summaries_export_the_latest_step_and_revisions_replace_it() -> None:
    state = new_state()
    state.add_summary(summary(5, {"kl": stats([0.1, 0.3])}, missing=[7], stragglers=[3]))
    labels = {"run": "r1", "stage": "rollout"}
    assert value(state, "rlpulse_step_mean", metric="kl", **labels) == pytest.approx(0.2)
    assert value(state, "rlpulse_step_max", metric="kl", **labels) == 0.3
    assert value(state, "rlpulse_step_ranks_missing", **labels) == 1.0
    assert value(state, "rlpulse_step_ranks_reported", **labels) == 7.0
    assert value(state, "rlpulse_step_stragglers", **labels) == 1.0
    assert value(state, "rlpulse_step_last_rank_lag_seconds", **labels) == 0.25
    assert value(state, "rlpulse_run_step", **labels) == 5.0
    state.add_summary(summary(5, {"kl": stats([0.1, 0.3, 0.5])}, revision=2))
    assert value(state, "rlpulse_step_mean", metric="kl", **labels) == pytest.approx(0.3)
    assert value(state, "rlpulse_step_ranks_missing", **labels) == 0.0
    state.add_summary(summary(4, {"kl": stats([9.0])}))  # an older step, arriving late
    assert value(state, "rlpulse_step_mean", metric="kl", **labels) == pytest.approx(0.3)


def test_missing_ranks_streak_counts_consecutive_steps_that_closed_with_ranks_missing() -> None:
    state = new_state()
    labels = {"run": "r1", "stage": "rollout"}
    streaks = []
    for step, missing in [(1, [7]), (2, [7]), (3, [6, 7]), (4, []), (5, [2])]:
        state.add_summary(summary(step, {"m": stats([1.0])}, missing=missing))
        if step == 2:  # a revision (the late rank arrived) changes no streak
            state.add_summary(summary(2, {"m": stats([1.0])}, revision=2))
        streaks.append(value(state, "rlpulse_step_ranks_missing_streak", **labels))
    assert streaks == [1.0, 2.0, 3.0, 0.0, 1.0]


def test_zscore_is_the_rules_zscore_over_a_full_window_of_steps() -> None:
    state = new_state(zscore_window=5)
    labels = {"run": "r1", "stage": "actor", "metric": "actor_loss"}
    losses = [0.50, 0.52, 0.49, 0.51, 0.50, 0.48, 5.0, 0.51]
    scores = []
    for step, loss in enumerate(losses, start=1):
        state.add_summary(summary(step, {"actor_loss": stats([loss])}, stage="actor"))
        scores.append(value(state, "rlpulse_step_zscore", **labels))
    assert scores[:4] == [None] * 4  # the window is not full yet
    for step in range(5, len(losses) + 1):
        assert scores[step - 1] == zscore(losses[step - 5 : step])
    assert scores[6] is not None and scores[6] > 3  # the spike
    assert all(abs(s) < 3 for i, s in enumerate(scores[4:], start=4) if i != 6 and s is not None)


def test_zscore_starts_a_fresh_window_with_a_new_attempt() -> None:
    state = new_state(zscore_window=3)
    labels = {"run": "r1", "stage": "actor", "metric": "m"}
    for step, loss in [(1, 1.0), (2, 2.0), (3, 4.0)]:
        state.add_summary(summary(step, {"m": stats([loss])}, stage="actor"))
    assert value(state, "rlpulse_step_zscore", **labels) == zscore([1.0, 2.0, 4.0])
    state.add_summary(summary(2, {"m": stats([3.0])}, stage="actor", attempt=1))
    assert value(state, "rlpulse_step_zscore", **labels) is None


def test_an_event_the_worker_would_dead_letter_is_dropped_and_counted() -> None:
    state = new_state(namespace="verl")
    state.add_event(event(9, 1, {"reward_mean": 1.0}, world_size=8), live=True)  # rank >= world
    state.add_event(event(0, -1, {"reward_mean": 1.0}), live=True)  # negative step
    assert names_of(state, "verl_") == set()
    assert state.dropped["invalid"] == 2


def test_verdicts_count_per_rule_and_verdict_each_id_once() -> None:
    state = new_state()

    def verdict(verdict_id: str, kind: str) -> ActionVerdict:
        return {
            "verdict_id": verdict_id, "command_id": f"c-{verdict_id}", "run_id": "r1",
            "attempt": 0, "stage": "rollout", "rule_id": "unstable-reward",
            "rule_version": "v", "verdict": kind,  # type: ignore[typeddict-item]
            "expectation": "e", "issued_step": 21, "applied_at_step": 22,
            "decided_at_step": 32, "value": 2.1, "evidence": {}, "reason": "r",
            "emitted_ns": T0,
        }  # fmt: skip

    state.add_verdict(verdict("a", "ineffective"), live=True)
    state.add_verdict(verdict("a", "ineffective"), live=True)  # re-sent after a crash
    state.add_verdict(verdict("b", "ineffective"), live=True)
    state.add_verdict(verdict("c", "unknown"), live=True)
    state.add_verdict(verdict("d", "effective"), live=False)  # from the lookback: not counted
    labels = {"run": "r1", "rule": "unstable-reward"}
    family = "rlpulse_run_action_verdicts_total"
    assert value(state, family, verdict="ineffective", **labels) == 2.0
    assert value(state, family, verdict="unknown", **labels) == 1.0
    assert value(state, family, verdict="effective", **labels) is None


def test_commands_and_acks_count_per_rule_action_and_status() -> None:
    state = new_state()
    guard = command([("checkpoint", {"tag": "kl"}), ("stop", {})])
    scale = command([("scale_rollout_batch", {"factor": 2.0})], rule="unstable-reward")
    dry = command([("stop", {})], rule="would-stop", dry_run=True)
    by_hand = command([("stop", {})], rule=None, run="r2")
    for issued in (guard, scale, dry, by_hand):
        state.add_command(issued, live=True)
    state.add_ack(ack(guard), live=True)
    state.add_ack(ack(scale, "noop"), live=True)
    got = {
        tuple(sorted(labels)): v
        for (name, labels), v in samples(state).items()
        if name == "rlpulse_run_commands_total"
    }
    assert got == {
        (("action", "checkpoint"), ("dry_run", "false"), ("rule", "kl-guard"), ("run", "r1")): 1.0,
        (("action", "stop"), ("dry_run", "false"), ("rule", "kl-guard"), ("run", "r1")): 1.0,
        (
            ("action", "scale_rollout_batch"),
            ("dry_run", "false"),
            ("rule", "unstable-reward"),
            ("run", "r1"),
        ): 1.0,
        (("action", "stop"), ("dry_run", "true"), ("rule", "would-stop"), ("run", "r1")): 1.0,
        (("action", "stop"), ("dry_run", "false"), ("rule", "operator"), ("run", "r2")): 1.0,
    }
    assert value(state, "rlpulse_run_acks_total", run="r1", rule="kl-guard", status="applied") == 1
    assert value(state, "rlpulse_run_acks_total", run="r1", rule="unstable-reward", status="noop")
    # Stopped by kl-guard (the dry-run stop does not count); r2 by an operator.
    assert value(state, "rlpulse_run_stopped", run="r1", rule="kl-guard") == 1.0
    assert value(state, "rlpulse_run_stopped", run="r1", rule="would-stop") is None
    assert value(state, "rlpulse_run_stopped", run="r2", rule="operator") == 1.0
    assert (
        value(
            state,
            "rlpulse_run_last_command_timestamp_seconds",
            run="r1",
            rule="kl-guard",
            actions="checkpoint,stop",
            dry_run="false",
        )
        == T0 / 1e9
    )


def test_a_new_attempt_is_no_longer_stopped() -> None:
    state = new_state()
    state.add_command(command([("stop", {})]), live=True)
    state.add_event(event(0, 43, {"m": 1.0}, attempt=1), live=True)
    assert names_of(state, "rlpulse_run_stopped") == set()


def test_lookback_restores_gauges_but_counters_count_only_live_records() -> None:
    state = new_state(namespace="verl")
    guard = command([("checkpoint", {}), ("stop", {})])
    state.add_event(event(0, 1, {"reward_mean": 1.5}), live=False)
    state.add_summary(summary(1, {"reward_mean": stats([1.5])}))
    state.add_command(guard, live=False)
    state.add_ack(ack(guard), live=False)
    state.add_dead_letter("undecodable: marker 0000 is not c301", live=False)
    # What the lookback restores:
    assert value(state, "verl_reward_mean", run="r1", stage="rollout", rank="0") == 1.5
    assert value(state, "rlpulse_step_mean", run="r1", stage="rollout", metric="reward_mean") == 1.5
    assert value(state, "rlpulse_run_stopped", run="r1", rule="kl-guard") == 1.0
    assert value(state, "rlpulse_run_last_event_timestamp_seconds", run="r1") == T0 / 1e9
    # ... and what it does not count (a restarted exporter's counters start over):
    assert names_of(state, "rlpulse_run_commands") == set()
    assert names_of(state, "rlpulse_run_acks") == set()
    assert names_of(state, "rlpulse_host_events") == set()
    assert value(state, "rlpulse_dlq_messages_total", reason="undecodable") == 0.0
    state.add_event(event(0, 2, {"reward_mean": 1.6}), live=True)
    state.add_dead_letter("undecodable: marker 0000 is not c301", live=True)
    state.add_dead_letter("too_late: step 3 closed 700 s ago", live=True)
    host = {"run": "r1", "host": "node-a", "kind": "metrics"}
    assert value(state, "rlpulse_host_events_total", **host) == 1.0
    assert value(state, "rlpulse_dlq_messages_total", reason="undecodable") == 1.0
    assert value(state, "rlpulse_dlq_messages_total", reason="too_late") == 1.0


def test_runs_expire_after_run_end_or_silence_and_release_their_names() -> None:
    state = new_state(namespace="verl", expire_ended_s=60, expire_silent_s=600)
    state.add_event(event(0, 1, {"loss": 1.0}, run="ended"), live=True)
    state.add_event(event(0, 1, {}, run="ended", kind="run_end", at_ns=T0 + 10 * S), live=True)
    state.add_event(event(0, 1, {"loss": 2.0, "x/y": 1.0}, run="silent"), live=True)
    state.add_summary(summary(1, {"loss": stats([2.0])}, run="silent"))
    assert value(state, "rlpulse_run_ended", run="ended") == 1.0
    assert state.expire(T0 + 70 * S) == []  # 60 s after run_end, not more
    assert state.expire(T0 + 71 * S) == ["ended"]
    assert state.series == 2 + 6
    assert state.expire(T0 + 600 * S) == []
    assert state.expire(T0 + 601 * S) == ["silent"]
    assert state.series == 0
    assert names_of(state, "verl_") == set()
    assert names_of(state, "rlpulse_run_") == set()
    # Names were released: x_y may now be logged by another name without a collision.
    state.add_event(event(0, 2, {"x.y": 3.0}, run="next", at_ns=T0 + 601 * S), live=True)
    assert value(state, "verl_x_y", run="next", stage="rollout", rank="0") == 3.0


def test_a_run_that_starts_again_after_run_end_does_not_expire_as_ended() -> None:
    state = new_state(expire_ended_s=60)
    state.add_event(event(0, 5, {}, kind="run_end"), live=True)
    state.add_event(event(0, 5, {}, kind="run_start", attempt=1, at_ns=T0 + 5 * S), live=True)
    assert value(state, "rlpulse_run_ended", run="r1") == 0.0
    assert state.expire(T0 + 120 * S) == []


def test_non_finite_values_are_exported_as_they_are() -> None:
    state = new_state(namespace="verl")
    state.add_event(event(0, 1, {"kl_divergence": math.nan, "grad_norm": math.inf}), True)
    nan_stats = stats([1.0])
    nan_stats["mean"], nan_stats["non_finite"] = math.nan, 1
    state.add_summary(summary(1, {"kl_divergence": nan_stats}))
    labels = {"run": "r1", "stage": "rollout", "rank": "0"}
    kl = value(state, "verl_kl_divergence", **labels)
    assert kl is not None and math.isnan(kl)
    assert value(state, "verl_grad_norm", **labels) == math.inf
    non_finite = {"run": "r1", "stage": "rollout", "metric": "kl_divergence"}
    assert value(state, "rlpulse_step_non_finite_ranks", **non_finite) == 1.0


def test_log_records_count_per_host_and_level_live_only_custom_levels_as_other() -> None:
    state = new_state()
    state.add_logs(LogTally("run-1", "node-a", ["INFO", "ERROR"]), live=False)  # lookback
    assert names_of(state, "rlpulse_host_log_records") == set()
    state.add_logs(LogTally("run-1", "node-a", ["INFO", "INFO", "ERROR", "TRACE"]), live=True)
    state.add_logs(LogTally("run-1", "node-b", ["CRITICAL"]), live=True)
    counted = {
        (labels["host"], labels["level"]): count
        for (name, pairs), count in samples(state).items()
        if name == "rlpulse_host_log_records_total"
        for labels in [dict(pairs)]
    }
    assert counted == {
        ("node-a", "INFO"): 2.0,
        ("node-a", "ERROR"): 1.0,
        ("node-a", "OTHER"): 1.0,
        ("node-b", "CRITICAL"): 1.0,
    }
