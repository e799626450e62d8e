"""Verdicts on rule commands: the checks' semantics, without a broker (rlpulse.rules.verdicts)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpulse.rules import RuleEngine, parse_rules
from rlpulse.rules.exceptions import RulesError
from rlpulse.rules.state import RunState
from rlpulse.rules.verdicts import acknowledge, end_attempt, observe, verdict_id
from rlpulse.schemas.records import ActionVerdict, CommandAck, ControlCommand, MetricStats
from tests.unit.test_rules_evaluator import RUN, summary

DOUBLE = """
  - id: unstable-reward
    metric: reward_mean
    stage: rollout
    over_steps: {window: 3, stat: var}
    when: "> 0.5"
    cooldown_steps: 5
    actions: [{scale_rollout_batch: {factor: 2, max: 256}}]
    expect:
      over_steps: {window: 3, stat: var}
      when: "<= 0.5"
      within_steps: 6
"""
SWINGING = [0.0, 2.0, 0.0, 2.0, 0.0, 2.0, 0.0, 2.0, 0.0, 2.0, 0.0, 2.0, 0.0, 2.0, 0.0]
"""Reward means whose variance over 3 steps stays near 0.9: the doubling never helps."""


def ack(command: ControlCommand, step: int | None, status: str = "applied") -> CommandAck:
    return {
        "command_id": command["command_id"],
        "run_id": RUN,
        "attempt": 1,
        "status": status,  # type: ignore[typeddict-item]
        "applied_at_step": step,
        "detail": {"new_batch": "128"} if status == "applied" else {"reason": "at the cap"},
        "acked_ns": 0,
    }


class Run:
    """One run attempt through the engine and the checks, state kept as JSON in between."""

    def __init__(self, rules: str) -> None:
        self.engine = RuleEngine(parse_rules("version: 1\nrules:\n" + rules, "test.yaml"))
        self.state: RunState | None = None
        self.commands: list[ControlCommand] = []
        self.verdicts: list[ActionVerdict] = []

    def step(self, step: int, reward: float | None, stage: str = "rollout") -> None:
        metrics: dict[str, float | MetricStats] = {} if reward is None else {"reward_mean": reward}
        state, commands = self.engine.evaluate(self.state, summary(step, metrics, stage=stage), 0)
        self.verdicts += observe(state, summary(step, metrics, stage=stage), step)
        self.state = json.loads(json.dumps(state))
        self.commands += commands

    def ack(self, record: CommandAck) -> None:
        assert self.state is not None
        self.verdicts += acknowledge(self.state, record, 0)
        self.state = json.loads(json.dumps(self.state))

    def end(self) -> None:
        assert self.state is not None
        self.verdicts += end_attempt(self.state, 0)


def test_a_doubling_that_calms_the_reward_is_effective_where_the_window_says_so() -> None:
    run = Run(DOUBLE)
    for step, reward in enumerate([0.0, 2.0, 0.0], start=1):
        run.step(step, reward)
    (command,) = run.commands
    assert command["step"] == 3
    run.ack(ack(command, 4))  # applied at step 4: steps 5.. count
    for step, reward in zip(range(4, 12), [2.0, 1.0, 1.1, 1.0, 0.9, 1.0, 1.0, 1.0], strict=True):
        run.step(step, reward)
    (verdict,) = run.verdicts
    assert verdict["verdict"] == "effective"
    assert verdict["decided_at_step"] == 7  # steps 5, 6, 7: the first full window after 4
    assert verdict["applied_at_step"] == 4 and verdict["issued_step"] == 3
    assert verdict["verdict_id"] == verdict_id(command["command_id"])
    assert verdict["rule_id"] == "unstable-reward" and verdict["stage"] == "rollout"
    assert list(verdict["evidence"]) == ["step_7"]
    assert verdict["value"] == pytest.approx(0.002222, rel=1e-3)
    assert "<= 0.5 at step 7, 3 step(s) after it was applied at step 4" in verdict["reason"]
    assert verdict["expectation"] == (
        "var of reward_mean over 3 steps (mean over ranks) <= 0.5 within 6 steps"
    )


def test_a_doubling_that_changes_nothing_is_ineffective_when_its_window_runs_out() -> None:
    run = Run(DOUBLE)
    for step, reward in enumerate(SWINGING[:3], start=1):
        run.step(step, reward)
    run.ack(ack(run.commands[0], 4))
    for step, reward in enumerate(SWINGING[3:], start=4):
        run.step(step, reward)
    first = run.verdicts[0]
    assert first["verdict"] == "ineffective"
    assert first["decided_at_step"] == 10  # applied 4 + within 6
    assert list(first["evidence"]) == ["step_7", "step_8", "step_9", "step_10"]
    assert "not met in steps 5..10 after it was applied at step 4" in first["reason"]
    assert "4 value(s) checked, the last 0.888889 at step 10" in first["reason"]


def test_the_verdict_does_not_depend_on_when_the_ack_arrives() -> None:
    outcomes = set()
    for ack_after in range(3, 12):
        run = Run(DOUBLE)
        rewards = [0.0, 2.0, 0.0, 2.0, 1.0, 1.1, 1.0, 0.9, 1.0, 1.0, 1.0]
        for step, reward in enumerate(rewards, start=1):
            run.step(step, reward)
            if step == ack_after:
                run.ack(ack(run.commands[0], 4))
        (verdict,) = run.verdicts
        outcomes.add((verdict["verdict"], verdict["decided_at_step"], verdict["value"]))
    assert len(outcomes) == 1, outcomes


@settings(max_examples=60, deadline=None)
@given(
    rewards=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=12, max_size=24),
    delay=st.integers(min_value=0, max_value=12),
    applied_after=st.integers(min_value=0, max_value=3),
)
def test_any_ack_delay_gives_the_verdict_of_an_ack_at_once(
    rewards: list[float], delay: int, applied_after: int
) -> None:
    def verdicts(ack_delay: int) -> list[tuple[str, int | None]]:
        run = Run(DOUBLE)
        due: int | None = None
        for step, reward in enumerate(rewards, start=1):
            run.step(step, reward)
            if len(run.commands) == 1 and due is None:
                due = step + ack_delay
            if due == step or (due is not None and due > step == len(rewards)):
                issued = run.commands[0]["step"]
                run.ack(ack(run.commands[0], issued + applied_after))
        run.end()
        return [(v["verdict"], v["decided_at_step"]) for v in run.verdicts]

    assert verdicts(delay) == verdicts(0)


def test_an_ack_read_before_its_command_was_issued_is_kept_for_it() -> None:
    run = Run(DOUBLE)
    for step, reward in enumerate([0.0, 2.0], start=1):
        run.step(step, reward)
    first = Run(DOUBLE)  # the same run evaluated elsewhere: the command id is the same
    for step, reward in enumerate([0.0, 2.0, 0.0], start=1):
        first.step(step, reward)
    run.ack(ack(first.commands[0], 4))  # a replaying worker read the ack first
    for step, reward in zip(range(3, 8), [0.0, 1.0, 1.0, 1.0, 1.0], strict=True):
        run.step(step, reward)
    (verdict,) = run.verdicts
    assert (verdict["verdict"], verdict["decided_at_step"]) == ("effective", 7)


def test_a_noop_ack_says_unknown_at_once_with_the_trainers_reason() -> None:
    run = Run(DOUBLE)
    for step, reward in enumerate(SWINGING[:3], start=1):
        run.step(step, reward)
    run.ack(ack(run.commands[0], 4, status="noop"))
    (verdict,) = run.verdicts
    assert verdict["verdict"] == "unknown"
    assert verdict["applied_at_step"] is None
    assert verdict["reason"] == (
        "the command was not applied: the trainer acknowledged it noop (reason: at the cap)"
    )
    run.ack(ack(run.commands[0], 4))  # a second ack changes nothing
    assert len(run.verdicts) == 1


def test_a_run_that_ends_inside_the_window_gets_unknown() -> None:
    run = Run(DOUBLE)
    for step, reward in enumerate(SWINGING[:3], start=1):
        run.step(step, reward)
    run.ack(ack(run.commands[0], 4))
    for step, reward in enumerate(SWINGING[3:6], start=4):
        run.step(step, reward)
    run.end()
    (verdict,) = run.verdicts
    assert verdict["verdict"] == "unknown"
    assert verdict["reason"] == (
        "the run attempt ended at step 6 before 6 steps had passed after its applied step 4"
    )
    assert run.state is not None and run.state.get("checks") == {}


def test_a_metric_that_stops_arriving_gives_unknown_not_ineffective() -> None:
    run = Run(DOUBLE)
    for step, reward in enumerate(SWINGING[:3], start=1):
        run.step(step, reward)
    run.ack(ack(run.commands[0], 4))
    run.step(4, 1.0)
    run.step(5, 1.0)
    for step in range(6, 11):
        run.step(step, None)  # the stage goes on without the metric
    (verdict,) = run.verdicts
    assert verdict["verdict"] == "unknown"
    assert verdict["decided_at_step"] == 10
    assert "reward_mean was reported in 1 of steps 5..10" in verdict["reason"]
    assert "the window needs 3" in verdict["reason"]


def test_a_replayed_summary_counts_once() -> None:
    run = Run(DOUBLE)
    for step, reward in enumerate([0.0, 2.0, 0.0], start=1):
        run.step(step, reward)
    run.ack(ack(run.commands[0], 3))
    run.step(4, 1.0)
    assert run.state is not None
    again = observe(run.state, summary(4, {"reward_mean": 1.0}, stage="rollout"), 0)
    assert again == [] and run.state["checks"][run.commands[0]["command_id"]]["values"] == [
        [4, 1.0]
    ]


def test_a_dry_run_command_gets_no_check() -> None:
    run = Run(DOUBLE.replace("cooldown_steps: 5", "cooldown_steps: 5\n    mode: dry_run"))
    for step, reward in enumerate(SWINGING[:3], start=1):
        run.step(step, reward)
    assert run.commands and run.commands[0]["dry_run"]
    assert run.state is not None and not run.state.get("checks")


def test_an_expectation_in_another_stage_reads_that_stage() -> None:
    rules = DOUBLE.replace(
        "      over_steps: {window: 3, stat: var}\n      when", "      stage: actor\n      when"
    ).replace('"<= 0.5"', '"< 1"')
    run = Run(rules)
    for step, reward in enumerate([0.0, 2.0, 0.0], start=1):
        run.step(step, reward)
    run.ack(ack(run.commands[0], 4))
    run.step(5, 0.0)  # rollout: not the stage it reads
    run.step(5, 3.0, stage="actor")
    run.step(6, 0.5, stage="actor")
    (verdict,) = run.verdicts
    assert (verdict["verdict"], verdict["decided_at_step"]) == ("effective", 6)
    assert "in stage actor < 1 within 6 steps" in verdict["expectation"]


def test_an_expectation_does_not_change_the_rules_version() -> None:
    with_expect = parse_rules("version: 1\nrules:\n" + DOUBLE, "a.yaml").rules[0]
    without = DOUBLE[: DOUBLE.index("    expect:")]
    plain = parse_rules("version: 1\nrules:\n" + without, "b.yaml").rules[0]
    assert with_expect.version == plain.version


@pytest.mark.parametrize(
    ("change", "where", "message"),
    [
        (
            ("within_steps: 6", "within_steps: 2"),
            "test.yaml:14:21",
            "expect.within_steps must be >= over_steps.window (3)",
        ),
        (
            ("actions: [{scale_rollout_batch: {factor: 2, max: 256}}]", "actions: [{stop: {}}]"),
            "test.yaml:12:7",
            "expect: cannot check a rule that stops the run: no step follows its command",
        ),
        (
            ('when: "<= 0.5"', 'whne: "<= 0.5"'),
            "test.yaml:13:7",
            "expect: unknown key 'whne'; did you mean 'when'?",
        ),
        (
            ('when: "<= 0.5"', 'when: "outside [0, 1]"\n      across_ranks: worst'),
            "test.yaml:13:13",
            "expect.when: across_ranks 'worst' needs a >, >=, < or <= condition",
        ),
        (
            ("within_steps: 6", "within_steps: 0"),
            "test.yaml:14:21",
            "expect.within_steps must be >= 1",
        ),
    ],
)
def test_a_malformed_expectation_is_refused_with_file_line_and_column(
    change: tuple[str, str], where: str, message: str
) -> None:
    text = "version: 1\nrules:\n" + DOUBLE.replace(*change)
    with pytest.raises(RulesError) as caught:
        parse_rules(text, "test.yaml")
    assert f"{where}: [unstable-reward] {message}" in str(caught.value), str(caught.value)


def test_an_inherited_worst_needs_an_ordered_expectation_too() -> None:
    rules = DOUBLE.replace("stage: rollout\n", "stage: rollout\n    across_ranks: worst\n")
    rules = rules.replace('when: "<= 0.5"', 'when: "outside [0, 1]"')
    with pytest.raises(RulesError) as caught:
        parse_rules("version: 1\nrules:\n" + rules, "test.yaml")
    assert (
        "[unstable-reward] expect: across_ranks 'worst' needs a >, >=, < or <= condition, got "
        "'outside [0, 1]'; it is the rule's, or set expect.across_ranks"
    ) in str(caught.value)
