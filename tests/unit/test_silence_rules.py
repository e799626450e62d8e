"""Silence and missing-rank rules: the rules file, the pure pipeline, the backtest (no broker)."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from rlpulse.offline.backtest import RecordedEvent, run_backtest
from rlpulse.rules import RuleEngine, RuleSet, RulesFileError, load_preset, parse_rules
from rlpulse.schemas.records import ControlCommand, TrainerEvent
from rlpulse.settings import JoinerSettings
from rlpulse.streams.pipeline import PipelineTables, StepPipeline

S = 1_000_000_000
T0 = 1_700_000_000 * S
_seq = itertools.count()

SILENT = """
version: 1
rules:
  - id: run-hung
    silent: {factor: 3, floor_s: 20}
    actions: [{alert: {message: the run hangs}}, {capture_stacks: {}}]
"""

MISSING = """
version: 1
rules:
  - id: rank-gone
    missing_ranks: {}
    for_steps: 3
    actions: [{alert: {message: a rank stopped reporting}}]
"""


def event(
    step: int, rank: int, at_s: float, *, stage: str = "actor", world_size: int = 2, **extra: Any
) -> TrainerEvent:
    fields: dict[str, Any] = {
        "kind": "metrics",
        "run_id": "run",
        "attempt": 1,
        "step": step,
        "stage": stage,
        "rank": rank,
        "world_size": world_size,
        "metrics": {"loss": 1.0},
        "level": None,
        "message": None,
        "tags": {},
        "timestamp_ns": T0 + round(at_s * S),
        "hostname": "host",
        "pid": 1,
        "producer_id": f"p{rank}",
        "seq": next(_seq),
        "policy_version": None,
        "trace_id": None,
    }
    return fields | extra  # type: ignore[return-value]


def pipeline(rules: str | RuleSet, tables: PipelineTables | None = None) -> StepPipeline:
    engine = RuleEngine(parse_rules(rules, "rules.yaml") if isinstance(rules, str) else rules)
    return StepPipeline(tables or PipelineTables(), lambda: engine, JoinerSettings(grace_s=5))


def train(line: StepPipeline, steps: range, step_s: float = 10.0) -> float:
    """Two ranks log each step ``step_s`` apart; returns the time of the last step's start."""
    at = 0.0
    for step in steps:
        at = step * step_s
        for rank in (0, 1):
            line.add(event(step, rank, at + 0.1 * rank), T0 + round((at + 0.1 * rank) * S))
    return at


def tick(line: StepPipeline, at_s: float) -> list[ControlCommand]:
    return line.expire(T0 + round(at_s * S)).silences


# -- the rules file ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (
            "silent: {factor: 0.5}\n    actions: [{alert: {message: m}}]",
            "rules.yaml:4:22: [r] silent.factor must be > 1, got 0.5",
        ),
        (
            "silent: {floor_s: -3}\n    actions: [{alert: {message: m}}]",
            "rules.yaml:4:23: [r] silent.floor_s must be >= 5, got -3",
        ),
        (
            "silent: {}\n    actions: [{stop: {}}]",
            "rules.yaml:3:5: [r] a silent rule may only alert or "
            "capture_stacks (a hung trainer cannot apply stop)",
        ),
        (
            "silent: {}\n    for_steps: 3\n    actions: [{alert: {message: m}}]",
            "rules.yaml:3:5: [r] for_steps does not apply to a silent rule",
        ),
        (
            "silent: {}\n    metric: loss\n    when: '> 1'\n    actions: [{alert: {message: m}}]",
            "rules.yaml:3:5: [r] a rule watches one thing: give metric (with "
            "when), silent or missing_ranks; got metric and silent",
        ),
        (
            "missing_ranks: {at_least: 0}\n    actions: [{alert: {message: m}}]",
            "rules.yaml:4:31: [r] missing_ranks.at_least must be >= 1, got 0",
        ),
        (
            "actions: [{alert: {message: m}}]",
            "rules.yaml:3:5: [r] a rule watches one thing: give metric (with "
            "when), silent or missing_ranks",
        ),
    ],
)
def test_a_bad_silence_or_missing_rule_is_refused_with_file_line_column(
    rule: str, expected: str
) -> None:
    text = f"version: 1\nrules:\n  - id: r\n    {rule}\n"
    with pytest.raises(RulesFileError) as caught:
        parse_rules(text, "rules.yaml")
    assert [str(problem) for problem in caught.value.problems] == [expected]


# -- silence -----------------------------------------------------------------------------------


def test_silence_fires_once_after_the_bound_and_samples_do_not_count() -> None:
    line = pipeline(SILENT)
    last = train(line, range(1, 6))  # a step every 10 s: bound max(3 x 10, 20) = 30 s
    for second in range(int(last) + 1, int(last) + 30):  # the sampler goes on
        line.add(event(second, 0, second, stage="system", world_size=1), T0 + second * S)
        assert tick(line, second) == []
    fired = tick(line, last + 30.5)
    assert [(c["rule_id"], c["step"], c["stage"]) for c in fired] == [("run-hung", 5, "actor")]
    command = fired[0]
    assert [a["type"] for a in command["actions"]] == ["alert", "capture_stacks"]
    assert command["reason"] == (
        "the run started no step for 30 s since step 5; more than max(3 x median step time "
        "10 s, 20 s) = 30 s"
    )
    assert command["evidence"]["median_step_s"] == pytest.approx(10.0)
    assert tick(line, last + 60) == []  # once per silence, not once per tick


def test_a_step_closed_by_grace_does_not_reset_the_clock_and_a_new_step_does() -> None:
    line = pipeline(SILENT)
    last = train(line, range(1, 6))
    line.add(event(6, 0, last + 10), T0 + round((last + 10) * S))  # rank 1 never logs step 6
    assert tick(line, last + 16) == []  # step 6 closes by grace (5 s): not activity
    first = tick(line, last + 10 + 30.5)
    assert [c["step"] for c in first] == [6]
    train_again = last + 50
    for rank in (0, 1):
        line.add(event(7, rank, train_again), T0 + round(train_again * S))
    second = tick(line, train_again + 31)
    assert [c["step"] for c in second] == [7]
    assert first[0]["command_id"] != second[0]["command_id"]


def test_the_floor_holds_until_two_steps_started() -> None:
    line = pipeline(SILENT)
    train(line, range(1, 2))
    assert tick(line, 10 + 19) == []
    fired = tick(line, 10 + 21)
    assert fired and "fewer than two steps to time" in fired[0]["reason"]


def test_a_restarted_worker_fires_the_same_command() -> None:
    tables = PipelineTables()
    line = pipeline(SILENT, tables)
    last = train(line, range(1, 6))
    saved = copy.deepcopy(tables)  # the state written before the firing
    fired = tick(line, last + 31)
    again = tick(pipeline(SILENT, saved), last + 40)
    assert [c["command_id"] for c in again] == [c["command_id"] for c in fired]


def test_a_stopped_or_ended_run_is_never_silent() -> None:
    line = pipeline(SILENT)
    last = train(line, range(1, 6))
    line.add(event(5, 0, last + 1, kind="run_end", stage="actor"), T0 + round((last + 1) * S))
    assert tick(line, last + 100) == []


def test_a_stage_rule_watches_its_stage_only() -> None:
    rules = SILENT.replace("silent:", "stage: rollout\n    silent:")
    line = pipeline(rules)
    train(line, range(1, 6))  # stage actor only
    assert tick(line, 1000) == []


@pytest.mark.parametrize("preset", ["seed", "verl", "trl"])
def test_the_presets_take_stacks_when_the_run_hangs(preset: str) -> None:
    line = pipeline(load_preset(preset))
    last = train(line, range(1, 11), step_s=40.0)  # bound: max(5 x 40 s, 300 s) = 300 s
    for second in range(int(last) + 10, int(last) + 300, 10):
        line.add(event(second, 0, second, stage="system", world_size=1), T0 + second * S)
        assert tick(line, second) == []
    fired = tick(line, last + 300.5)
    assert [(c["rule_id"], c["step"]) for c in fired] == [("run-silent", 10)]
    assert [a["type"] for a in fired[0]["actions"]] == ["alert", "capture_stacks"]


# -- missing ranks -----------------------------------------------------------------------------


def test_missing_ranks_fire_when_the_same_rank_misses_three_steps() -> None:
    line = pipeline(MISSING)
    commands: list[ControlCommand] = []
    for step, present in [(1, {0, 1, 2}), (2, {0, 1}), (3, {0, 2}), (4, {0, 2}), (5, {0, 2})]:
        at = step * 10.0
        for rank in sorted(present):
            output = line.add(event(step, rank, at, world_size=3), T0 + round(at * S) + rank)
            commands += output.commands
        commands += line.expire(T0 + round((at + 6) * S)).commands  # grace 5 s closes it
    assert [(c["rule_id"], c["step"]) for c in commands] == [("rank-gone", 5)]
    assert commands[0]["reason"] == "rank 1 of 3 missing from 3 consecutive steps (3, 4, 5)"
    assert commands[0]["evidence"]["rank_1"] == 1.0


# -- the backtest ------------------------------------------------------------------------------


def recording(steps: range) -> list[RecordedEvent]:
    return [
        RecordedEvent(event(step, rank, step * 10.0 + 0.1 * rank), line=index)
        for index, (step, rank) in enumerate(itertools.product(steps, (0, 1)))
    ]


def test_the_backtest_fires_a_silence_when_time_passes_by_later_events_or_its_end() -> None:
    ruleset = parse_rules(SILENT, "rules.yaml")
    quiet = run_backtest(ruleset, recording(range(1, 6)), JoinerSettings(grace_s=5))
    assert quiet.commands == []  # it ends at its last event: nothing says time passed
    until = T0 + 200 * S
    ended = run_backtest(ruleset, recording(range(1, 6)), JoinerSettings(grace_s=5), None, until)
    assert [(c["step"], c["issued_ns"]) for c in ended.commands] == [(5, T0 + 80 * S + 1)]
    later = [*recording(range(1, 6)), *recording(range(20, 21))]  # a gap of 150 s, then step 20
    gap = run_backtest(ruleset, later, JoinerSettings(grace_s=5))
    assert [(c["step"], c["issued_ns"]) for c in gap.commands] == [(5, T0 + 80 * S + 1)]
