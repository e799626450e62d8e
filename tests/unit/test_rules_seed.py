"""The two seed rules (rules/presets/seed.yaml) on hand-computed step sequences.

Every window statistic in here is worked out in a comment with ``math.fsum`` so a reader
can check it: mean = fsum(x) / n, var = fsum((x - mean) ** 2) / n (population).
"""

from __future__ import annotations

import json
import math
import uuid

from rlpulse.rules import RuleEngine, RuleSet, load_preset
from rlpulse.rules.model import Rule
from rlpulse.schemas.records import ControlCommand, MetricStats, StepSummary

RUN = "run-7"
RANKS = 8
WORST_RANK = 5


def stats(value: float) -> MetricStats:
    """Every rank reports ``value``; rank 5 is named as holding the max."""
    return {
        "count": RANKS,
        "sum": value * RANKS,
        "mean": value,
        "std": 0.0 if math.isfinite(value) else math.nan,
        "min": value,
        "max": value,
        "min_rank": 0,
        "max_rank": WORST_RANK,
        "non_finite": 0 if math.isfinite(value) else RANKS,
    }


def summary(
    step: int, stage: str = "rollout", *, revision: int = 1, attempt: int = 1, **metrics: float
) -> StepSummary:
    return {
        "summary_id": f"{RUN}/{attempt}/{stage}/{step}/{revision}",
        "run_id": RUN,
        "attempt": attempt,
        "stage": stage,
        "step": step,
        "revision": revision,
        "world_size": RANKS,
        "ranks_reported": list(range(RANKS)),
        "missing_ranks": [],
        "metrics": {name: stats(value) for name, value in metrics.items()},
        "tags": {},
        "last_rank": RANKS - 1,
        "last_rank_lag_ns": 0,
        "closed_by": "complete",
        "first_event_ns": 0,
        "last_event_ns": 0,
        "emitted_ns": 0,
    }


class Run:
    """One run attempt fed through an engine; the state is stored as JSON in between."""

    def __init__(self, ruleset: RuleSet | None = None) -> None:
        self.engine = RuleEngine(ruleset if ruleset is not None else load_preset("seed"))
        self.stored: str | None = None

    def feed(self, item: StepSummary) -> list[ControlCommand]:
        state = None if self.stored is None else json.loads(self.stored)
        state, commands = self.engine.evaluate(state, item, now_ns=1_000_000 + item["step"])
        self.stored = json.dumps(state)  # what the faust Table does; NaN survives
        return commands

    def rewards(self, values: list[float], first_step: int = 1) -> dict[int, list[ControlCommand]]:
        """Feed ``reward_mean`` values at consecutive steps; the commands of each step."""
        return {
            step: self.feed(summary(step, reward_mean=value))
            for step, value in enumerate(values, start=first_step)
        }

    def kl(self, values: list[float], first_step: int = 1) -> dict[int, list[ControlCommand]]:
        """Feed ``kl_divergence`` values (stage actor) at consecutive steps."""
        return {
            step: self.feed(summary(step, "actor", kl_divergence=value))
            for step, value in enumerate(values, start=first_step)
        }

    def rule_state(self, stage: str, rule_id: str) -> dict[str, object]:
        assert self.stored is not None
        state: dict[str, object] = json.loads(self.stored)["stages"][stage]["rules"][rule_id]
        return state


def fired_at(commands: dict[int, list[ControlCommand]]) -> list[int]:
    return [step for step, issued in commands.items() for _ in issued]


def seed_rule(rule_id: str) -> Rule:
    return load_preset("seed").rule(rule_id)


# -- unstable-reward: var of reward_mean over 5 steps > 0.5 ------------------------------------


def test_window_not_full_does_not_fire() -> None:
    run = Run()
    assert fired_at(run.rewards([0.0, 100.0, -100.0, 50.0])) == []
    assert run.rule_state("rollout", "unstable-reward")["status"] == "inactive"
    # Step 5 fills the window: fsum([0, 100, -100, 50, 0]) = 50 -> mean 10;
    # squared deviations 100, 8100, 12100, 1600, 100 -> fsum 22000 -> var 4400 > 0.5.
    fifth = run.feed(summary(5, reward_mean=0.0))
    assert [c["step"] for c in fifth] == [5]
    assert fifth[0]["evidence"]["value"] == 4400.0


def test_variance_exactly_half_does_not_fire() -> None:
    # Steps 1..5: fsum([0, 2, 0.5, 1.5, 1]) = 5 -> mean 1; squared deviations
    # 1, 1, 0.25, 0.25, 0 -> fsum 2.5 -> var 2.5 / 5 = 0.5 exactly: "> 0.5" is false.
    # Step 6 slides to [2, 0.5, 1.5, 1, 0]: the same multiset, var 0.5 again.
    values = [0.0, 2.0, 0.5, 1.5, 1.0, 0.0]
    assert math.fsum((x - 1.0) ** 2 for x in values[:5]) / 5 == 0.5
    run = Run()
    assert fired_at(run.rewards(values)) == []
    assert run.rule_state("rollout", "unstable-reward")["status"] == "inactive"


def test_variance_just_above_half_fires() -> None:
    # Nudge two values by 2**-10: [0, 2, 0.5 - 2**-10, 1.5 + 2**-10, 1]; fsum = 5 -> mean 1;
    # squared deviations 1, 1, 0.5009765625**2 (twice, = 0.25097751617431640625), 0
    # -> fsum 2.5019550323486328125 -> var = 0.5003910064697266 > 0.5.
    values = [0.0, 2.0, 0.5 - 2**-10, 1.5 + 2**-10, 1.0]
    expected = math.fsum([1.0, 1.0, 0.5009765625**2, 0.5009765625**2, 0.0]) / 5
    assert expected == 0.5003910064697266
    commands = Run().rewards(values)
    assert fired_at(commands) == [5]
    (command,) = commands[5]
    assert command["reason"] == (
        "var of reward_mean over the last 5 steps (1..5) = 0.500391 > 0.5; mean over 8 ranks"
    )
    assert command["actions"] == [
        {"type": "scale_rollout_batch", "params": {"factor": 2.0, "max": 256}}
    ]
    params = command["actions"][0]["params"]
    assert isinstance(params["factor"], float)
    assert isinstance(params["max"], int)
    assert command["evidence"] == {
        "value": expected,
        "threshold": 0.5,
        **{f"step_{step}": value for step, value in enumerate(values, start=1)},
    }
    assert command["stage"] == "rollout"
    assert command["rule_id"] == "unstable-reward"
    assert command["rule_version"] == seed_rule("unstable-reward").version
    assert command["dry_run"] is False
    assert command["origin"] == "rule"
    assert command["issued_ns"] == 1_000_005


def test_nan_in_the_window_blocks_until_it_leaves() -> None:
    # The NaN of step 2 is in the windows ending at steps 5 (1..5) and 6 (2..6): var is NaN,
    # and a comparison with NaN is false. The window ending at step 7 holds steps 3..7 =
    # [2, 0, 2, 1, 0]: fsum 5 -> mean 1; squared deviations 1, 1, 1, 0, 1 -> fsum 4 -> 0.8.
    run = Run()
    commands = run.rewards([0.0, math.nan, 2.0, 0.0, 2.0, 1.0, 0.0])
    assert fired_at(commands) == [7]
    (command,) = commands[7]
    assert command["evidence"]["value"] == 0.8
    assert command["reason"] == (
        "var of reward_mean over the last 5 steps (3..7) = 0.8 > 0.5; mean over 8 ranks"
    )
    assert "step_2" not in command["evidence"]


def test_nan_is_kept_in_the_window_as_reported() -> None:
    run = Run()
    run.rewards([0.0, math.nan, 2.0])
    window = run.rule_state("rollout", "unstable-reward")["window"]
    assert isinstance(window, list)
    assert window[0] == [1, 0.0]
    assert window[1][0] == 2
    assert math.isnan(window[1][1])


def test_cooldown_blocks_five_evaluations() -> None:
    # Alternating 0, 2: every full window holds three of one value and two of the other,
    # e.g. [0, 2, 0, 2, 0]: fsum 4 -> mean 0.8; squared deviations 0.64 (x3), 1.44 (x2)
    # -> fsum 4.8 -> var 0.96 > 0.5 at every step from 5 on. It fires at 5, is blocked for
    # the 5 evaluations 6..10, fires at 11, is blocked 12..16, fires at 17.
    run = Run()
    commands = run.rewards([0.0, 2.0] * 10)
    assert fired_at(commands) == [5, 11, 17]


def test_blocked_rule_fires_at_first_qualifying_unblocked_evaluation() -> None:
    # Fires at 5 ([0, 2, 0, 2, 0]: var 0.96); 6..10 are blocked whatever they show.
    # Step 11 is unblocked but the window 7..11 is [1, 1, 1, 1, 1]: var 0.
    # Step 12: [1, 1, 1, 1, 3]: fsum 7 -> mean 1.4; squared deviations 0.16 (x4), 2.56
    # -> var 3.2 / 5 = 0.64 > 0.5: fires at 12.
    values = [0.0, 2.0, 0.0, 2.0, 0.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0]
    run = Run()
    commands = run.rewards(values)
    assert fired_at(commands) == [5, 12]
    expected = math.fsum((x - 1.4) ** 2 for x in [1.0, 1.0, 1.0, 1.0, 3.0]) / 5
    assert commands[12][0]["evidence"]["value"] == expected
    assert commands[12][0]["reason"].startswith(
        "var of reward_mean over the last 5 steps (8..12) = 0.64 > 0.5;"
    )


def test_cooldown_shows_as_blocked_in_state() -> None:
    run = Run()
    run.rewards([0.0, 2.0, 0.0, 2.0, 0.0, 2.0])
    state = run.rule_state("rollout", "unstable-reward")
    assert state["status"] == "blocked"
    assert state["last_fired_step"] == 5
    assert state["evaluations"] == 6


def test_unstable_reward_watches_only_the_rollout_stage() -> None:
    run = Run()
    for step, value in enumerate([0.0, 2.0] * 5, start=1):
        assert run.feed(summary(step, "actor", reward_mean=value)) == []


# -- kl-guard: kl_divergence > 0.3 for 3 consecutive steps, once -------------------------------


def test_kl_exactly_at_threshold_does_not_count() -> None:
    assert fired_at(Run().kl([0.3] * 6)) == []


def test_kl_three_consecutive_steps_fire_once_with_checkpoint_then_stop() -> None:
    # 37: 0.3 is not > 0.3; 38, 39, 40 are: fires at 40.
    commands = Run().kl([0.3, 0.31, 0.35, 0.412], first_step=37)
    assert fired_at(commands) == [40]
    (command,) = commands[40]
    assert command["actions"] == [
        {"type": "checkpoint", "params": {"tag": "kl_violation"}},
        {"type": "stop", "params": {}},
    ]
    assert command["reason"] == (
        "kl_divergence 0.412 > 0.3 for 3 consecutive steps (38, 39, 40); "
        "mean over 8 ranks, worst rank 5"
    )
    assert command["evidence"] == {
        "value": 0.412,
        "threshold": 0.3,
        "step_38": 0.31,
        "step_39": 0.35,
        "step_40": 0.412,
    }
    assert command["stage"] == "actor"
    assert command["step"] == 40
    assert command["rule_id"] == "kl-guard"
    assert command["rule_version"] == seed_rule("kl-guard").version
    assert command["run_id"] == RUN
    assert command["attempt"] == 1
    assert command["dry_run"] is False


def test_kl_break_in_the_streak_resets_the_count() -> None:
    # 1, 2 hold; 3 (0.3) breaks; 4, 5 hold (2 in a row); 6 is the third in a row.
    commands = Run().kl([0.4, 0.4, 0.3, 0.4, 0.4, 0.4])
    assert fired_at(commands) == [6]
    assert commands[6][0]["reason"].startswith(
        "kl_divergence 0.4 > 0.3 for 3 consecutive steps (4, 5, 6);"
    )


def test_kl_nan_breaks_the_streak() -> None:
    assert fired_at(Run().kl([0.4, 0.4, math.nan, 0.4, 0.4])) == []


def test_kl_once_prevents_a_second_firing() -> None:
    # As a dry run the stop does not end the run attempt, so only `once` keeps it quiet.
    seed = load_preset("seed")
    dry = Rule.model_validate({**seed_rule("kl-guard").model_dump(), "mode": "dry_run"})
    run = Run(RuleSet(version=1, rules=[seed.rule("unstable-reward"), dry]))
    commands = run.kl([0.5] * 12)
    assert fired_at(commands) == [3]
    assert commands[3][0]["dry_run"] is True
    assert run.rule_state("actor", "kl-guard")["status"] == "blocked"
    # A dry-run stop does not suppress other rules.
    assert fired_at(run.rewards([0.0, 2.0, 0.0, 2.0, 0.0])) == [5]


def test_nothing_is_issued_after_stop() -> None:
    run = Run()
    assert fired_at(run.kl([0.5, 0.5, 0.5])) == [3]
    # The stop holds for the whole run attempt: other stages and rules stay quiet.
    assert fired_at(run.kl([0.5] * 10, first_step=4)) == []
    assert fired_at(run.rewards([0.0, 2.0] * 5)) == []
    assert run.stored is not None
    assert json.loads(run.stored)["stopped_by"]["rule_id"] == "kl-guard"


def test_reemitted_and_revised_summaries_are_ignored() -> None:
    run = Run()
    assert run.feed(summary(1, "actor", kl_divergence=0.4)) == []
    assert run.feed(summary(2, "actor", kl_divergence=0.4)) == []
    # Re-emitted step 2 and step 1, and a revision of step 2: counting any would fire.
    assert run.feed(summary(2, "actor", kl_divergence=0.4)) == []
    assert run.feed(summary(1, "actor", kl_divergence=0.4)) == []
    assert run.feed(summary(2, "actor", revision=2, kl_divergence=0.9)) == []
    assert run.rule_state("actor", "kl-guard")["evaluations"] == 2
    (command,) = run.feed(summary(3, "actor", kl_divergence=0.4))
    assert command["evidence"] == {
        "value": 0.4,
        "threshold": 0.3,
        "step_1": 0.4,
        "step_2": 0.4,
        "step_3": 0.4,
    }


def test_command_id_is_deterministic_across_fresh_engines() -> None:
    sequence = [0.5, 0.5, 0.5]
    first, second = Run(), Run()
    assert first.engine is not second.engine
    a, b = first.kl(sequence)[3], second.kl(sequence)[3]
    assert a == b
    assert uuid.UUID(a[0]["command_id"]).version == 5
    other_attempt = Run()
    c = [other_attempt.feed(summary(s, "actor", attempt=2, kl_divergence=0.5)) for s in (1, 2, 3)]
    assert c[2][0]["command_id"] != a[0]["command_id"]
