"""The shipped presets: each rule fires on the failure it is written for, and only there.

Every rule of every preset has a :class:`Case`: a hand-made sequence of values that shows
its failure (with the steps it must fire at), a healthy trajectory it must stay quiet on,
and optionally a near miss that must stay quiet too. The summaries look like what the verl,
TRL and OpenRLHF integrations publish: stage ``trainer``, world size 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pytest

from rlpulse.rules import Rule, RuleEngine, RuleSet, load_preset
from rlpulse.rules.loader import list_presets
from rlpulse.rules.model import NonFinite
from rlpulse.schemas.records import ControlCommand, MetricStats, StepSummary

NAN, INF = math.nan, math.inf
TRAINER_PRESETS = ("verl", "trl", "openrlhf")
HEALTHY_STEPS = 80


def stats(value: float) -> MetricStats:
    """One rank (rank 0) reported ``value``."""
    finite = math.isfinite(value)
    return {
        "count": 1,
        "sum": value,
        "mean": value,
        "std": 0.0 if finite else NAN,
        "min": value,
        "max": value,
        "min_rank": 0,
        "max_rank": 0,
        "non_finite": 0 if finite else 1,
    }


def summary(step: int, metrics: Mapping[str, float]) -> StepSummary:
    """A trainer-integration summary: rank 0's reduced dict, stage trainer, world size 1."""
    return {
        "summary_id": f"run/1/trainer/{step}/1",
        "run_id": "run",
        "attempt": 1,
        "stage": "trainer",
        "step": step,
        "revision": 1,
        "world_size": 1,
        "ranks_reported": [0],
        "missing_ranks": [],
        "metrics": {name: stats(value) for name, value in metrics.items()},
        "tags": {},
        "last_rank": 0,
        "last_rank_lag_ns": 0,
        "closed_by": "complete",
        "first_event_ns": 0,
        "last_event_ns": 0,
        "emitted_ns": 0,
    }


def run(ruleset: RuleSet, steps: Sequence[Mapping[str, float]]) -> list[ControlCommand]:
    """Feed one summary per entry of ``steps`` (steps 1, 2, ...); return every command."""
    engine, state = RuleEngine(ruleset), None
    commands: list[ControlCommand] = []
    for step, metrics in enumerate(steps, start=1):
        state, issued = engine.evaluate(state, summary(step, metrics), now_ns=step)
        commands += issued
    return commands


def fired_at(rule: Rule, values: Sequence[float], metric: str | None = None) -> list[int]:
    """The steps at which ``rule`` alone fires on ``values`` of ``metric`` (its first name)."""
    name = metric if metric is not None else rule.metrics[0]
    only = RuleSet(version=1, rules=[rule])
    return [command["step"] for command in run(only, [{name: value} for value in values])]


def wave(base: float, amplitude: float, trend: float = 0.0) -> Callable[[int], float]:
    """A deterministic noisy trajectory: ``base + trend * step + amplitude * sin(1.3 step)``."""
    return lambda step: base + trend * step + amplitude * math.sin(1.3 * step)


@dataclass(frozen=True)
class Case:
    """How one rule is exercised."""

    failing: Sequence[float]  # values at steps 1, 2, ... that show the failure
    fires_at: Sequence[int]  # the steps the rule must fire at, and no others
    healthy: Callable[[int], float]  # a healthy trajectory of the watched quantity
    near_miss: Sequence[float] = ()  # close to the failure, but not it: quiet


NOISY_STEADY = [0.5 + 0.02 * math.sin(1.3 * step) for step in range(1, 20)]  # 19 values
NON_FINITE_STOP = Case(
    failing=[0.01, 0.02, NAN, NAN], fires_at=[3], healthy=wave(0.05, 0.04), near_miss=[1e30, -5]
)

# Cases by rule id; "<preset>/<rule id>" where a preset's rule of that id differs.
CASES: dict[str, Case] = {
    # var of [0, 2, 0, 2, 0]: mean 0.8, squared deviations 0.64*3 + 1.44*2 = 4.8, /5 = 0.96
    # > 0.5 at step 5; the cooldown of 5 evaluations blocks steps 6..10, step 11 qualifies.
    "unstable-reward": Case(
        failing=[0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0],
        fires_at=[5, 11],
        healthy=wave(0.2, 0.05, trend=0.004),
        # var of [0, 1.4, 0, 1.4, 0]: mean 0.56, squared deviations 0.3136 * 3 + 0.7056 * 2
        # = 2.352, / 5 = 0.4704 <= 0.5; sliding on gives the same multiset's mirror, 0.4704.
        near_miss=[0, 1.4, 0, 1.4, 0, 1.4, 0],
    ),
    "kl-guard": Case(
        failing=[0.1, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8],
        fires_at=[4],  # above 0.3 at steps 2, 3, 4; once
        healthy=wave(0.02, 0.01, trend=0.001),
        near_miss=[0.05, 0.35, 0.05, 0.4, 0.31, 0.05, 0.3, 0.3, 0.3],  # never 3 in a row > 0.3
    ),
    "kl-non-finite": NON_FINITE_STOP,
    "pg-loss-non-finite": NON_FINITE_STOP,
    "loss-non-finite": NON_FINITE_STOP,
    "policy-loss-non-finite": NON_FINITE_STOP,
    "value-loss-non-finite": NON_FINITE_STOP,
    "critic-loss-non-finite": NON_FINITE_STOP,
    "reward-non-finite": Case(
        failing=[0.3, 0.4, -INF], fires_at=[3], healthy=wave(0.2, 0.05, trend=0.004)
    ),
    "grad-norm-non-finite": NON_FINITE_STOP,
    # verl skips non-finite updates: only 3 non-finite grad norms in a row are a failure.
    "verl/grad-norm-non-finite": Case(
        failing=[0.5, NAN, 0.6, NAN, INF, NAN, NAN],
        fires_at=[6],
        healthy=wave(0.4, 0.05),
        near_miss=[0.5, NAN, 0.5, NAN, NAN, 0.5, NAN],
    ),
    # zscore of step 20 against steps 1..19 (mean ~0.5, std ~0.014): (5 - 0.5) / 0.014 > 6.
    "grad-norm-spike": Case(
        failing=[*NOISY_STEADY, 5.0], fires_at=[20], healthy=wave(0.4, 0.05), near_miss=[0.5] * 25
    ),
    "ppo-kl-high": Case(
        failing=[0.001, 0.06, 0.07, 0.08],
        fires_at=[4],
        healthy=wave(0.002, 0.001),
        near_miss=[0.001, 0.06, 0.002, 0.07, 0.07, 0.001],
    ),
    "entropy-collapse": Case(
        failing=[0.5, 0.3, *[0.01] * 10],
        fires_at=[12],  # below 0.03 at steps 3..12
        healthy=wave(0.6, 0.02, trend=-0.005),  # 0.6 -> 0.2 over 80 steps: a slow decline
        near_miss=[*[0.02] * 9, 0.05, *[0.02] * 9],
    ),
    "entropy-sudden-drop": Case(
        failing=[*NOISY_STEADY, 0.1],
        fires_at=[20],
        healthy=wave(0.6, 0.02, trend=-0.005),
        near_miss=[0.5] * 25,  # a flat entropy: std 0, zscore NaN, never true
    ),
    "response-length-collapse": Case(
        failing=[300, 200, 50, 3, 2, 1, 1, 1],
        fires_at=[8],  # below 10 tokens at steps 4..8
        healthy=wave(400, 60, trend=2),
        near_miss=[5, 5, 5, 5, 12, 5, 5, 5, 5],
    ),
    "response-length-pinned-at-max": Case(
        failing=[0.1, *[0.8] * 10],
        fires_at=[11],  # above 0.5 at steps 2..11
        healthy=wave(0.05, 0.03),
        near_miss=[*[0.9] * 9, 0.5, *[0.9] * 9],  # 0.5 is not > 0.5
    ),
    "reward-flat-at-zero": Case(
        failing=[0.1, *[0.0] * 10],
        fires_at=[11],  # exactly 0 at steps 2..11
        healthy=wave(0.2, 0.05, trend=0.004),
        near_miss=[*[0.0] * 9, 0.01, *[0.0] * 9],
    ),
    "truncated-responses": Case(
        failing=[0.1, 0.35, 0.4, 0.5, 0.6],
        fires_at=[4],  # above 0.3 at steps 2, 3, 4; the cooldown holds step 5
        healthy=wave(0.05, 0.03),
        near_miss=[0.35, 0.4, 0.3, 0.5, 0.31, 0.1],  # 0.3 is not > 0.3
    ),
    "repetitive-responses": Case(
        failing=[0.0, 0.1, 0.08, 0.2],
        fires_at=[4],
        healthy=wave(0.01, 0.008),
        near_miss=[0.1, 0.1, 0.05, 0.1, 0.1, 0.0],  # 0.05 is not > 0.05
    ),
    "empty-responses": Case(
        failing=[0.0, 0.2, 0.5, 0.15],
        fires_at=[4],
        healthy=wave(0.01, 0.01),
        near_miss=[0.2, 0.2, 0.1, 0.9, 0.9, 0.0],  # 0.1 is not > 0.1
    ),
    "no-learning-signal": Case(
        failing=[0.5, *[1.0] * 10],
        fires_at=[11],
        healthy=wave(0.3, 0.1),
        near_miss=[*[1.0] * 9, 0.875, *[1.0] * 9],  # one group of 8 had a reward spread
    ),
}


def case_of(preset: str, rule_id: str) -> Case:
    """The case of a preset's rule: its preset-specific one, else the one of its id."""
    return CASES.get(f"{preset}/{rule_id}") or CASES[rule_id]


RULES = [
    (preset, rule)
    for preset in TRAINER_PRESETS
    for rule in load_preset(preset).rules
    if rule.metric is not None  # silence rules: tests/unit/test_silence_rules.py
]
PRESET_RULES = [pytest.param(preset, rule, id=f"{preset}/{rule.id}") for preset, rule in RULES]
NON_FINITE_RULES = [
    pytest.param(preset, rule, id=f"{preset}/{rule.id}")
    for preset, rule in RULES
    if isinstance(rule.when, NonFinite)
]


def test_presets_ship_about_forty_rules() -> None:
    assert list_presets() == ["openrlhf", "seed", "trl", "verl"]
    assert sum(len(load_preset(name).rules) for name in list_presets()) == 47


@pytest.mark.parametrize("preset", TRAINER_PRESETS)
def test_every_rule_has_a_case(preset: str) -> None:
    missing = [
        rule.id
        for rule in load_preset(preset).rules
        if rule.metric is not None and f"{preset}/{rule.id}" not in CASES and rule.id not in CASES
    ]
    assert missing == []


@pytest.mark.parametrize(("preset", "rule"), PRESET_RULES)
def test_rule_fires_on_its_failure(preset: str, rule: Rule) -> None:
    case = case_of(preset, rule.id)
    assert fired_at(rule, case.failing) == list(case.fires_at)


@pytest.mark.parametrize(("preset", "rule"), PRESET_RULES)
def test_rule_fires_under_every_alias(preset: str, rule: Rule) -> None:
    case = case_of(preset, rule.id)
    for name in rule.metrics[1:]:
        assert fired_at(rule, case.failing, metric=name) == list(case.fires_at), name


@pytest.mark.parametrize(("preset", "rule"), PRESET_RULES)
def test_rule_stays_quiet_when_healthy(preset: str, rule: Rule) -> None:
    case = case_of(preset, rule.id)
    assert fired_at(rule, [case.healthy(step) for step in range(1, HEALTHY_STEPS + 1)]) == []
    assert fired_at(rule, case.near_miss) == []


@pytest.mark.parametrize(("preset", "rule"), NON_FINITE_RULES)
def test_non_finite_rules_fire_on_infinities_too(preset: str, rule: Rule) -> None:
    assert preset in TRAINER_PRESETS
    for bad in (INF, -INF, NAN):
        assert fired_at(rule, [*[bad] * rule.for_steps]) == [rule.for_steps], bad


@pytest.mark.parametrize("preset", TRAINER_PRESETS)
def test_whole_preset_is_quiet_on_a_healthy_run(preset: str) -> None:
    ruleset = load_preset(preset)
    trajectory: dict[str, Callable[[int], float]] = {}
    for rule in ruleset.rules:  # every metric name a rule watches, first name of each list
        if rule.metric is not None:
            trajectory.setdefault(rule.metrics[0], case_of(preset, rule.id).healthy)
    steps = [
        {name: healthy(step) for name, healthy in trajectory.items()}
        for step in range(1, HEALTHY_STEPS + 1)
    ]
    assert run(ruleset, steps) == []


@pytest.mark.parametrize("preset", TRAINER_PRESETS)
def test_non_finite_stops_never_checkpoint(preset: str) -> None:
    """A NaN run's weights are broken: saving them would only invite resuming from them."""
    for rule in load_preset(preset).rules:
        if isinstance(rule.when, NonFinite) and rule.stops:
            assert "checkpoint" not in [action.type for action in rule.actions], rule.id
            assert rule.once, rule.id


@pytest.mark.parametrize("preset", TRAINER_PRESETS)
def test_trainer_presets_watch_the_trainer_stage(preset: str) -> None:
    rules = load_preset(preset).rules
    assert all(rule.stage in (None, "trainer") for rule in rules)


@pytest.mark.parametrize("preset", TRAINER_PRESETS)
def test_seed_scenarios_are_mapped(preset: str) -> None:
    seed, ruleset = load_preset("seed"), load_preset(preset)
    for rule_id in ("unstable-reward", "kl-guard"):
        original, mapped = seed.rule(rule_id), ruleset.rule(rule_id)
        same = {"metric", "stage"}  # trainer names, and no stage (trainer integrations)
        assert mapped.model_dump(exclude=same) == original.model_dump(exclude=same)


def test_a_nan_stop_silences_the_rest_of_the_run() -> None:
    """With the whole verl preset: the NaN KL stops the run; nothing is issued after it."""
    healthy = {"actor/kl_loss": 0.01, "actor/entropy": 0.5, "critic/score/mean": 0.0}
    steps = [dict(healthy) for _ in range(12)]
    steps[2]["actor/kl_loss"] = NAN
    commands = run(load_preset("verl"), steps)
    assert [(c["step"], c["rule_id"]) for c in commands] == [(3, "kl-non-finite")]
    assert [a["type"] for a in commands[0]["actions"]] == ["alert", "stop"]
    assert "is nan" in commands[0]["reason"]
