"""Evaluator semantics beyond the seed rules: aliases, stages, tags, modes, stats, reloads."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpulse.rules import RuleEngine, RuleSet, load_preset, parse_rules
from rlpulse.rules.exceptions import RulesError, RuleStateError
from rlpulse.rules.state import RunState
from rlpulse.schemas.records import ControlCommand, MetricStats, StepSummary

RUN = "run-3"


def stats(
    mean: float,
    *,
    low: float | None = None,
    high: float | None = None,
    count: int = 8,
    min_rank: int = 2,
    max_rank: int = 6,
) -> MetricStats:
    low = mean if low is None else low
    high = mean if high is None else high
    return {
        "count": count,
        "sum": mean * count,
        "mean": mean,
        "std": 0.0,
        "min": low,
        "max": high,
        "min_rank": min_rank,
        "max_rank": max_rank,
        "non_finite": 0 if math.isfinite(mean) else 1,
    }


def summary(
    step: int,
    metrics: dict[str, float | MetricStats],
    *,
    stage: str = "actor",
    tags: dict[str, str] | None = None,
    world_size: int = 8,
) -> StepSummary:
    return {
        "summary_id": f"{RUN}/1/{stage}/{step}/1",
        "run_id": RUN,
        "attempt": 1,
        "stage": stage,
        "step": step,
        "revision": 1,
        "world_size": world_size,
        "ranks_reported": list(range(world_size)),
        "missing_ranks": [],
        "metrics": {
            name: value if isinstance(value, dict) else stats(value)
            for name, value in metrics.items()
        },
        "tags": tags or {},
        "last_rank": None,
        "last_rank_lag_ns": 0,
        "closed_by": "complete",
        "first_event_ns": 0,
        "last_event_ns": 0,
        "emitted_ns": 0,
    }


def engine(rules_yaml: str) -> RuleEngine:
    return RuleEngine(parse_rules("version: 1\nrules:\n" + rules_yaml, "test.yaml"))


def feed(rule_engine: RuleEngine, items: list[StepSummary]) -> list[ControlCommand]:
    """All commands for ``items`` of one run attempt, state stored as JSON in between."""
    stored, issued = None, []
    for item in items:
        state, commands = rule_engine.evaluate(stored, item, now_ns=7)
        stored = json.loads(json.dumps(state))
        issued += commands
    return issued


def steps_of(commands: list[ControlCommand]) -> list[tuple[str | None, int]]:
    return [(c["rule_id"], c["step"]) for c in commands]


GUARD = """
  - id: guard
    metric: x
    when: "> 1"
    actions: [{stop: {}}]
"""
WATCH = """
  - id: watch
    metric: x
    when: "> 1"
    actions: [{alert: {severity: warning, message: x is high}}]
"""


def test_alias_list_binds_to_first_listed_name_of_first_carrier() -> None:
    rules = engine("""
  - id: score
    metric: [reward_mean, critic/score/mean, reward]
    when: "> 1"
    for_steps: 2
    actions: [{alert: {severity: info, message: high}}]
""")
    commands = feed(
        rules,
        [
            summary(1, {"reward": 0.0, "critic/score/mean": 2.0}),  # binds critic/score/mean
            summary(2, {"reward_mean": 5.0}),  # does not carry the bound name: no evaluation
            summary(3, {"critic/score/mean": 2.0}),
        ],
    )
    assert steps_of(commands) == [("score", 3)]
    assert commands[0]["reason"].startswith(
        "critic/score/mean 2 > 1 for 2 consecutive steps (1, 3)"
    )


def test_counts_evaluations_not_step_numbers() -> None:
    rules = engine(GUARD.replace('when: "> 1"', 'when: "> 1"\n    for_steps: 3'))
    commands = feed(rules, [summary(step, {"x": 2.0}) for step in (10, 20, 30)])
    assert steps_of(commands) == [("guard", 30)]
    assert "(10, 20, 30)" in commands[0]["reason"]


def test_stop_suppresses_later_rules_in_the_same_evaluation() -> None:
    commands = feed(engine(GUARD + WATCH), [summary(1, {"x": 2.0}), summary(2, {"x": 2.0})])
    assert steps_of(commands) == [("guard", 1)]


def test_rules_before_the_stop_in_file_order_still_fire() -> None:
    commands = feed(engine(WATCH + GUARD), [summary(1, {"x": 2.0}), summary(2, {"x": 2.0})])
    assert steps_of(commands) == [("watch", 1), ("guard", 1)]


def test_dry_run_stop_is_marked_and_suppresses_nothing() -> None:
    dry_guard = GUARD.replace("actions:", "mode: dry_run\n    actions:")
    commands = feed(engine(dry_guard + WATCH), [summary(1, {"x": 2.0})])
    assert steps_of(commands) == [("guard", 1), ("watch", 1)]
    assert [c["dry_run"] for c in commands] == [True, False]


def test_match_tags_must_all_be_present_and_equal() -> None:
    rules = engine(WATCH.replace("actions:", "match: {tags: {team: a, algo: grpo}}\n    actions:"))
    assert feed(rules, [summary(1, {"x": 2.0}, tags={"team": "a"})]) == []
    assert feed(rules, [summary(1, {"x": 2.0}, tags={"team": "b", "algo": "grpo"})]) == []
    tags = {"team": "a", "algo": "grpo", "extra": "1"}
    assert steps_of(feed(rules, [summary(1, {"x": 2.0}, tags=tags)])) == [("watch", 1)]


def test_rule_without_stage_keeps_state_per_stage() -> None:
    rules = engine(WATCH.replace('when: "> 1"', 'when: "> 1"\n    for_steps: 2'))
    commands = feed(
        rules,
        [
            summary(1, {"x": 2.0}, stage="actor"),
            summary(1, {"x": 2.0}, stage="critic"),
            summary(2, {"x": 2.0}, stage="actor"),
        ],
    )
    assert [(c["stage"], c["step"]) for c in commands] == [("actor", 2)]


def test_blocked_rule_keeps_counting_through_cooldown() -> None:
    # for_steps 2, cooldown 3: fires at evaluation 2; 3..5 are blocked (the streak grows to
    # 3); evaluation 6 is the first unblocked one and the streak (4) qualifies; the same
    # again from 6: 7..9 blocked, fires at 10.
    rules = engine(
        WATCH.replace('when: "> 1"', 'when: "> 1"\n    for_steps: 2\n    cooldown_steps: 3')
    )
    commands = feed(rules, [summary(step, {"x": 2.0}) for step in range(1, 12)])
    assert steps_of(commands) == [("watch", 2), ("watch", 6), ("watch", 10)]


@pytest.mark.parametrize(
    ("when", "reduced", "reason"),
    [
        ("> 1", 3.0, "x 3 > 1 at step 1; worst of 8 ranks (rank 6)"),
        ("< 0", -1.0, "x -1 < 0 at step 1; worst of 8 ranks (rank 2)"),
    ],
)
def test_worst_is_max_for_greater_and_min_for_less(when: str, reduced: float, reason: str) -> None:
    rules = engine(WATCH.replace('when: "> 1"', f'across_ranks: worst\n    when: "{when}"'))
    commands = feed(rules, [summary(1, {"x": stats(0.5, low=-1.0, high=3.0)})])
    assert [c["reason"] for c in commands] == [reason]
    assert commands[0]["evidence"]["value"] == reduced


def test_reason_names_missing_ranks() -> None:
    commands = feed(engine(WATCH), [summary(1, {"x": stats(2.0, count=6)})])
    assert commands[0]["reason"] == "x 2 > 1 at step 1; mean over 6 of 8 ranks, worst rank 6"


@pytest.mark.parametrize(
    ("when", "value", "fires"),
    [
        ("non_finite", math.nan, True),
        ("non_finite", -math.inf, True),
        ("non_finite", 1e308, False),
        ("!= 0", math.nan, False),  # comparisons with NaN are false, != included
        ("== 0", math.nan, False),
        ("> 0", math.inf, True),
        ("outside [0, 1]", 1.0, False),  # the bounds are inside
        ("outside [0, 1]", 1.5, True),
        ("outside [0, 1]", -0.5, True),
        ("outside [0, 1]", math.nan, False),
    ],
)
def test_conditions(when: str, value: float, fires: bool) -> None:
    rules = engine(WATCH.replace('when: "> 1"', f'when: "{when}"'))
    assert bool(feed(rules, [summary(1, {"x": value})])) is fires


def test_non_finite_reason() -> None:
    rules = engine(WATCH.replace('when: "> 1"', 'when: "non_finite"'))
    (command,) = feed(rules, [summary(4, {"x": math.nan})])
    assert command["reason"] == "x is nan at step 4; mean over 8 ranks, 1 non-finite"


@pytest.mark.parametrize(
    ("stat", "window", "values", "expected"),
    [
        # fsum([1, 2, 4]) / 3
        ("mean", 3, [1.0, 2.0, 4.0], 7 / 3),
        # mean 2; squared deviations 1, 0, 1 -> fsum 2 -> var 2/3; std its root
        ("var", 3, [1.0, 2.0, 3.0], 2 / 3),
        ("std", 3, [1.0, 2.0, 3.0], math.sqrt(2 / 3)),
        ("min", 3, [3.0, 1.0, 2.0], 1.0),
        ("max", 3, [3.0, 1.0, 2.0], 3.0),
        ("delta", 3, [3.0, 1.0, 2.5], -0.5),  # last - first
        # steps 1, 2, 3 (x mean 2), values 1, 3, 5 (y mean 3): sxy = 4, sxx = 2 -> slope 2
        ("slope", 3, [1.0, 3.0, 5.0], 2.0),
        # previous [1, 2, 3]: mean 2, std sqrt(2/3); (10 - 2) / sqrt(2/3)
        ("zscore", 4, [1.0, 2.0, 3.0, 10.0], 8 / math.sqrt(2 / 3)),
    ],
)
def test_window_stats(stat: str, window: int, values: list[float], expected: float) -> None:
    rules = engine(
        WATCH.replace(
            'when: "> 1"', f'over_steps: {{window: {window}, stat: {stat}}}\n    when: "!= 12345"'
        )
    )
    commands = feed(rules, [summary(step, {"x": v}) for step, v in enumerate(values, start=1)])
    assert [c["step"] for c in commands] == [len(values)]
    assert commands[0]["evidence"]["value"] == expected


def test_zscore_is_nan_when_previous_values_are_constant() -> None:
    rules = engine(
        WATCH.replace(
            'when: "> 1"', 'over_steps: {window: 3, stat: zscore}\n    when: "non_finite"'
        )
    )
    (command,) = feed(
        rules, [summary(step, {"x": v}) for step, v in [(1, 2.0), (2, 2.0), (3, 5.0)]]
    )
    assert math.isnan(command["evidence"]["value"])


def test_reloaded_rules_keep_the_state_of_unchanged_rules() -> None:
    old = RuleEngine(load_preset("seed"))
    state: RunState | None = None
    for step in (1, 2):
        state, _ = old.evaluate(
            state, summary(step, {"kl_divergence": 0.5, "reward_mean": 1.0}, stage="rollout"), 0
        )
    assert state is not None
    changed = load_preset("seed").model_dump()
    changed["rules"][1]["when"] = "> 0.25"
    new = RuleEngine(RuleSet.model_validate(changed))
    assert new.rules[0].version == old.rules[0].version
    assert new.rules[1].version != old.rules[1].version
    state, commands = new.evaluate(
        json.loads(json.dumps(state)),
        summary(3, {"kl_divergence": 0.5, "reward_mean": 1.0}, stage="rollout"),
        0,
    )
    assert commands == []
    rules = state["stages"]["rollout"]["rules"]
    assert rules["unstable-reward"]["evaluations"] == 3  # unchanged: carries on
    assert rules["kl-guard"]["evaluations"] == 1  # changed: starts over
    assert state["stages"]["rollout"]["last_step"] == 3


def test_changed_rule_starts_over() -> None:
    old = RuleEngine(load_preset("seed"))
    state: RunState | None = None
    for step in (1, 2):
        state, _ = old.evaluate(state, summary(step, {"kl_divergence": 0.5}), 0)
    changed = load_preset("seed").model_dump()
    changed["rules"][1]["when"] = "> 0.25"
    new = RuleEngine(RuleSet.model_validate(changed))
    state, commands = new.evaluate(state, summary(3, {"kl_divergence": 0.5}), 0)
    assert commands == []  # the new kl-guard has seen one evaluation, not three
    assert state["stages"]["actor"]["rules"]["kl-guard"]["evaluations"] == 1


def test_state_of_another_run_attempt_is_refused() -> None:
    rules = RuleEngine(load_preset("seed"))
    state = rules.new_state("other-run", 1)
    with pytest.raises(RuleStateError, match="other-run") as caught:
        rules.evaluate(state, summary(1, {"kl_divergence": 0.5}), 0)
    assert isinstance(caught.value, RulesError)


def test_summary_without_the_metric_is_not_an_evaluation() -> None:
    rules = engine(WATCH.replace('when: "> 1"', 'when: "> 1"\n    for_steps: 2'))
    commands = feed(rules, [summary(1, {"x": 2.0}), summary(2, {"y": 2.0}), summary(3, {"x": 2.0})])
    assert steps_of(commands) == [("watch", 3)]


def test_action_params_keep_their_types() -> None:
    rules = engine("""
  - id: all-actions
    metric: x
    when: "> 1"
    actions:
      - checkpoint: {}
      - scale_rollout_batch: {factor: 0.5, min: 8}
      - set: {key: lr, value: 0.0001}
      - set: {key: clip, value: null}
      - set: {key: steps, value: 3}
      - set: {key: flag, value: true}
      - alert: {severity: critical, message: look}
""")
    (command,) = feed(rules, [summary(1, {"x": 2.0})])
    assert command["actions"] == [
        {"type": "checkpoint", "params": {}},
        {"type": "scale_rollout_batch", "params": {"factor": 0.5, "min": 8}},
        {"type": "set", "params": {"key": "lr", "value": 0.0001}},
        {"type": "set", "params": {"key": "clip", "value": None}},
        {"type": "set", "params": {"key": "steps", "value": 3}},
        {"type": "set", "params": {"key": "flag", "value": True}},
        {"type": "alert", "params": {"severity": "critical", "message": "look"}},
    ]
    values = [action["params"].get("value") for action in command["actions"]]
    assert [type(v) for v in values[2:6]] == [float, type(None), int, bool]


KL_VALUES = st.sampled_from([0.1, 0.3, 0.31, 0.5, math.nan, math.inf])


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(KL_VALUES, min_size=1, max_size=30),
    noise=st.lists(st.tuples(st.integers(0, 29), st.booleans(), KL_VALUES), max_size=15),
)
def test_reemissions_and_revisions_never_change_the_commands(
    values: list[float], noise: list[tuple[int, bool, float]]
) -> None:
    rules = RuleEngine(load_preset("seed"))
    clean = [summary(step, {"kl_divergence": v}) for step, v in enumerate(values, start=1)]
    noisy: list[StepSummary] = []
    for item in clean:
        noisy.append(item)
        for back, revise, value in noise:
            if back < item["step"]:  # an earlier or the same step, again or as a revision
                again = summary(item["step"] - back, {"kl_divergence": value})
                again["revision"] = 2 if revise else 1
                noisy.append(again)
    assert feed(rules, noisy) == feed(rules, clean)
    in_memory: RunState | None = None
    commands: list[ControlCommand] = []
    for item in clean:  # the state need not go through JSON: same result
        in_memory, issued = rules.evaluate(in_memory, item, now_ns=7)
        commands += issued
    assert commands == feed(rules, clean)
