"""Property tests: the rule evaluator against the naive reference of ``rules_reference.py``.

Random rule sets (every DSL form) over random summary sequences of several runs, attempts
and stages, with NaN, infinities, huge and tiny values, step gaps, re-emitted steps,
revisions, resumes, summaries missing the metric and tags: per summary, the evaluator (its
state through JSON between calls, as the worker's faust table keeps it) issues exactly the
firings of the reference -- same rules, stages, steps, actions, dry-run marks, and the same
compared value to the bit -- and a second fresh engine issues the same commands, ids included.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlpulse.rules import RuleEngine, RuleSet
from rlpulse.rules.state import RunState
from rlpulse.schemas.records import ControlCommand, MetricStats, StepSummary
from tests.unit.rules_reference import Fired, ParamValue, Reference, RuleSpec, When

MAX = sys.float_info.max
TINY = 5e-324  # smallest subnormal
METRICS = ("a", "b", "c")
STAGES = ("rollout", "actor", "trainer")
RUNS = ("run-a", "run-b")
TAG_SETS: tuple[dict[str, str], ...] = (
    {},
    {"team": "a"},
    {"team": "a", "algo": "grpo"},
    {"team": "b", "algo": "grpo"},
)

SPECIAL = (0.0, -0.0, 0.3, 0.5, 1.0, -1.0, 2.0, math.nan, math.inf, -math.inf)
# x ** 2 (libm pow) and x * x differ in the last bit for these (glibc 2.36)
POW_MISROUNDED = (0.13002254942585267, -1.9335873116879183, -8.210065735192288e-130)
HUGE = (1e308, -1e308, MAX, -MAX, 1e200, -1e200, 1e154, math.inf, -math.inf, math.nan, 1.0)
SMALL = (TINY, -TINY, 2.2250738585072014e-308, 1e-300, 1e-160, 0.0, -0.0, *POW_MISROUNDED)
ANY_VALUE = st.one_of(
    st.sampled_from(SPECIAL),
    st.sampled_from(HUGE),
    st.sampled_from(SMALL),
    st.integers(-3, 3).map(float),
    st.floats(),
)
# Each example draws its values from one pool, so that huge values meet huge values (fsum
# overflows), NaN sits inside windows, and so on.
VALUE_POOLS = st.sampled_from(
    (
        st.one_of(st.sampled_from(SPECIAL), st.integers(-3, 3).map(float)),
        st.sampled_from(HUGE),
        st.sampled_from(SMALL),
        ANY_VALUE,
    )
)
THRESHOLDS = st.one_of(
    st.sampled_from((0.0, 0.5, 1.0, -1.0, 2.0, 0.3, 1e300, -1e300, TINY)),
    st.floats(allow_nan=False, allow_infinity=False),
)
STATS = ("mean", "std", "var", "min", "max", "delta", "slope", "zscore")
ACROSS = ("mean", "min", "max", "sum", "std", "worst")


# -- rules -----------------------------------------------------------------------------------

PARAM_VALUES: tuple[ParamValue, ...] = (None, 0.5, 3, True, "x")


@st.composite
def actions(
    draw: st.DrawFn, stop_one_in: int
) -> tuple[tuple[str, tuple[tuple[str, ParamValue], ...]], ...]:
    """0-2 actions, then maybe ``stop`` (it comes last); at least one in all."""
    chosen: list[tuple[str, tuple[tuple[str, ParamValue], ...]]] = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(("checkpoint", "scale", "set", "alert")))
        if kind == "checkpoint":
            chosen.append(("checkpoint", (("tag", "t"),) if draw(st.booleans()) else ()))
        elif kind == "scale":
            factor = draw(st.sampled_from((2.0, 0.5)))
            params: list[tuple[str, ParamValue]] = [("factor", factor)]
            if draw(st.booleans()):
                params.append(("min", 8))
            if factor > 1 or draw(st.booleans()):  # a growing factor needs its bound
                params.append(("max", 256))
            chosen.append(("scale_rollout_batch", tuple(params)))
        elif kind == "set":
            chosen.append(("set", (("key", "lr"), ("value", draw(st.sampled_from(PARAM_VALUES))))))
        else:
            chosen.append(("alert", (("severity", "warning"), ("message", "look"))))
    if not chosen or draw(st.integers(1, stop_one_in)) == 1:  # stop ends a run attempt's
        chosen.append(("stop", ()))  # commands: not too often, or little else is tested
    return tuple(chosen)


@st.composite
def conditions(draw: st.DrawFn, worst: bool, thresholds: st.SearchStrategy[float]) -> When:
    ops = (">", ">=", "<", "<=") if worst else (">", ">=", "<", "<=", "==", "!=")
    kind = "cmp" if worst else draw(st.sampled_from(("cmp", "cmp", "outside", "non_finite")))
    if kind == "non_finite":
        return ("non_finite",)
    if kind == "outside":
        low, high = sorted((draw(thresholds), draw(thresholds)))
        return ("outside", low, high)
    return ("cmp", draw(st.sampled_from(ops)), draw(thresholds))


@st.composite
def rule_specs(
    draw: st.DrawFn, index: int, thresholds: st.SearchStrategy[float], stop_one_in: int
) -> RuleSpec:
    metric: str | tuple[str, ...]
    if draw(st.booleans()):
        metric = draw(st.sampled_from(METRICS))
    else:
        metric = tuple(draw(st.permutations(METRICS))[: draw(st.integers(2, 3))])
    across = draw(st.sampled_from(ACROSS))
    over: tuple[str, int] | None = None
    if draw(st.booleans()):
        stat = draw(st.sampled_from(STATS))
        over = (stat, draw(st.integers(3 if stat == "zscore" else 2, 5)))
    match = draw(st.sampled_from((None, None, {"team": "a"}, {"team": "a", "algo": "grpo"})))
    return RuleSpec(
        id=f"r{index}",
        metric=metric,
        when=draw(conditions(across == "worst", thresholds)),
        stage=draw(st.sampled_from((None, None, "rollout", "actor", "critic"))),
        across_ranks=across,
        over_steps=over,
        for_steps=draw(st.integers(1, 4)),
        cooldown_steps=draw(st.sampled_from((0, 0, 1, 2, 3, 4))),
        once=draw(st.integers(0, 3)) == 0,
        dry_run=draw(st.integers(0, 2)) == 0,
        match_tags=None if match is None else tuple(sorted(match.items())),
        actions=draw(actions(stop_one_in)),
    )


@st.composite
def rule_sets(
    draw: st.DrawFn, thresholds: st.SearchStrategy[float] = THRESHOLDS, stop_one_in: int = 6
) -> list[RuleSpec]:
    count = draw(st.integers(1, 5))
    return [draw(rule_specs(index, thresholds, stop_one_in)) for index in range(count)]


# -- summaries -------------------------------------------------------------------------------


def stats_of(value: float, **fields: float) -> MetricStats:
    """MetricStats whose every reduction is ``value`` unless given."""
    values = {"sum": value, "mean": value, "std": value, "min": value, "max": value, **fields}
    return {
        "count": 4,
        "sum": values["sum"],
        "mean": values["mean"],
        "std": values["std"],
        "min": values["min"],
        "max": values["max"],
        "min_rank": 0,
        "max_rank": 3,
        "non_finite": sum(1 for v in values.values() if not math.isfinite(v)),
    }


@st.composite
def metric_stats(
    draw: st.DrawFn, values: st.SearchStrategy[float], same_fields: bool = False
) -> MetricStats:
    if same_fields:
        return stats_of(draw(values))
    # The evaluator only reads the joiner's reductions, so each field is drawn on its own:
    # reading the wrong field shows.
    stats = stats_of(
        0.0,
        **{name: draw(values) for name in ("sum", "mean", "std", "min", "max")},
    )
    stats["count"] = draw(st.integers(1, 8))
    stats["min_rank"], stats["max_rank"] = draw(st.integers(0, 7)), draw(st.integers(0, 7))
    return stats


def make_summary(
    run: str,
    attempt: int,
    stage: str,
    step: int,
    metrics: dict[str, MetricStats],
    *,
    revision: int = 1,
    tags: dict[str, str] | None = None,
) -> StepSummary:
    return {
        "summary_id": f"{run}/{attempt}/{stage}/{step}/{revision}",
        "run_id": run,
        "attempt": attempt,
        "stage": stage,
        "step": step,
        "revision": revision,
        "world_size": 4,
        "ranks_reported": [0, 1, 2, 3],
        "missing_ranks": [],
        "metrics": metrics,
        "tags": dict(tags or {}),
        "last_rank": None,
        "last_rank_lag_ns": 0,
        "closed_by": "complete",
        "first_event_ns": 0,
        "last_event_ns": 0,
        "emitted_ns": 0,
    }


KINDS = ("new",) * 10 + ("reemit", "revise", "resume", "old_attempt", "back", "orphan")


@st.composite
def scenarios(
    draw: st.DrawFn,
    pools: st.SearchStrategy[st.SearchStrategy[float]] = VALUE_POOLS,
    stages: Sequence[str] = (*STAGES, "rollout", "rollout"),
    runs_choice: Sequence[int] = (1, 1, 2),
    min_size: int = 1,
    max_size: int = 50,
    kinds: Sequence[str] = KINDS,
    missing_one_in: int = 4,
    same_fields: bool = False,
) -> list[StepSummary]:
    """Summaries of 1-2 runs, interleaved stages and attempts, as the joiner (mis)delivers them."""
    values = draw(pools)
    runs = RUNS[: draw(st.sampled_from(runs_choice))]
    run_tags = {run: draw(st.sampled_from(TAG_SETS)) for run in runs}
    attempt = dict.fromkeys(runs, 1)
    last: dict[tuple[str, int, str], int] = {}  # highest step emitted per (run, attempt, stage)
    emitted: list[StepSummary] = []
    out: list[StepSummary] = []

    def metrics() -> dict[str, MetricStats]:
        return {
            name: draw(metric_stats(values, same_fields))
            for name in METRICS
            if draw(st.integers(1, missing_one_in)) > 1
        }

    def tags(run: str) -> dict[str, str]:
        return draw(st.sampled_from(TAG_SETS)) if draw(st.integers(0, 9)) == 0 else run_tags[run]

    for _ in range(draw(st.integers(min_size, max_size))):
        kind = draw(st.sampled_from(kinds))
        run = draw(st.sampled_from(runs))
        stage = draw(st.sampled_from(stages))
        if kind in ("reemit", "revise") and emitted:
            again = draw(st.sampled_from(emitted))
            revision = 1 if kind == "reemit" else draw(st.integers(2, 3))
            out.append(
                make_summary(
                    again["run_id"],
                    again["attempt"],
                    again["stage"],
                    again["step"],
                    metrics() if draw(st.booleans()) else again["metrics"],
                    revision=revision,
                    tags=again["tags"],
                )
            )
            continue
        if kind == "resume":  # the trainer restarts from a checkpoint: the next attempt
            attempt[run] += 1
            continue
        current = attempt[run]
        if kind == "old_attempt" and current > 1:  # a late summary of the previous attempt
            current -= 1
        where = (run, current, stage)
        if kind == "back" and last.get(where, 0) > 2:  # out of order: below the last step
            step = draw(st.integers(1, last[where] - 1))
        else:
            step = last.get(where, draw(st.sampled_from((0, 1, 100)))) + draw(
                st.sampled_from((1, 1, 1, 2, 5, 10))
            )
            last[where] = step
        # "orphan": a revision 2 is the first this worker sees of a step; never evaluated
        revision = 2 if kind == "orphan" else 1
        item = make_summary(run, current, stage, step, metrics(), revision=revision, tags=tags(run))
        emitted.append(item)
        out.append(item)
    return out


# -- the comparison ----------------------------------------------------------------------------


def bits(value: float) -> str:
    """The value to the bit (``-0.0`` differs from ``0.0``; every NaN is the same)."""
    return "nan" if math.isnan(value) else value.hex()


def observed(command: ControlCommand) -> tuple[Any, ...]:
    return (
        command["rule_id"],
        command["stage"],
        command["step"],
        command["actions"],
        command["dry_run"],
        bits(command["evidence"]["value"]),
    )


def expected(fired: Fired) -> tuple[Any, ...]:
    return (fired.rule_id, fired.stage, fired.step, fired.actions, fired.dry_run, bits(fired.value))


def build(specs: Sequence[RuleSpec]) -> RuleSet:
    return RuleSet.model_validate({"version": 1, "rules": [spec.as_rule() for spec in specs]})


def check(specs: Sequence[RuleSpec], summaries: Sequence[StepSummary]) -> None:
    """Evaluator == reference per summary; a second fresh engine issues the same commands."""
    ruleset = build(specs)
    engine, twin = RuleEngine(ruleset), RuleEngine(build(specs))
    reference = Reference(specs)
    stored: dict[tuple[str, int], Any] = {}  # as JSON, like the worker's table
    in_memory: dict[tuple[str, int], RunState] = {}
    ids: dict[tuple[Any, ...], str] = {}
    for index, summary in enumerate(summaries):
        run_attempt = (summary["run_id"], summary["attempt"])
        before = json.dumps(summary)
        state, commands = engine.evaluate(stored.get(run_attempt), summary, now_ns=index)
        assert json.dumps(summary) == before, "the evaluator changed its input"
        stored[run_attempt] = json.loads(json.dumps(state))

        want = [expected(fired) for fired in reference.feed(summary)]
        assert [observed(c) for c in commands] == want, (
            f"summary #{index} {summary['run_id']}/{summary['attempt']} {summary['stage']} "
            f"step {summary['step']} rev {summary['revision']}"
        )

        in_memory[run_attempt], again = twin.evaluate(
            in_memory.get(run_attempt), summary, now_ns=index
        )
        assert [json.dumps(c, sort_keys=True) for c in again] == [
            json.dumps(c, sort_keys=True) for c in commands
        ]
        for command in commands:
            rule = ruleset.rule(str(command["rule_id"]))
            assert (command["run_id"], command["attempt"]) == run_attempt
            assert (command["origin"], command["rule_version"]) == ("rule", rule.version)
            assert command["reason"]
            key = (*run_attempt, command["stage"], rule.id, rule.version, command["step"])
            assert ids.setdefault(key, command["command_id"]) == command["command_id"]
    assert len(set(ids.values())) == len(ids), "two commands share an id"


# -- examples: the corners found so far ----------------------------------------------------------


def rule(when: When, **fields: Any) -> RuleSpec:
    fields.setdefault("id", "r0")
    fields.setdefault("metric", "a")
    fields.setdefault("actions", (("alert", (("severity", "warning"), ("message", "look"))),))
    return RuleSpec(when=when, **fields)


HIGH: When = ("cmp", ">", 1.0)
STOP: tuple[tuple[str, tuple[tuple[str, ParamValue], ...]], ...] = (("stop", ()),)


def series(values: Sequence[float], *, stage: str = "actor", start: int = 1) -> list[StepSummary]:
    return [
        make_summary("run-a", 1, stage, step, {"a": stats_of(value)})
        for step, value in enumerate(values, start=start)
    ]


@pytest.mark.slow
@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(specs=rule_sets(), summaries=scenarios())
@example(  # squares of huge finite values overflow: IEEE gives inf, not an OverflowError
    specs=[rule(("cmp", ">", 0.0), over_steps=("var", 2))], summaries=series([1e200, -1e200])
)
@example(  # fsum's intermediate overflow: the exact sum 1e308 is finite
    specs=[rule(("cmp", ">", 1e307), over_steps=("mean", 3))],
    summaries=series([1e308, 1e308, -1e308]),
)
def test_evaluator_matches_reference(specs: list[RuleSpec], summaries: list[StepSummary]) -> None:
    check(specs, summaries)


# The control flow -- streaks, cooldowns, once, stops, dry runs, file order -- where it is
# busiest: few distinct values, thresholds between them, long runs of one stage.
FEW_VALUES = (0.0, 1.0, 2.0)
FEW_THRESHOLDS = st.sampled_from((0.5, 1.0, 1.5))
STICKY_POOLS = st.sampled_from(FEW_VALUES).map(  # one value most of the time: long streaks
    lambda usual: st.sampled_from((usual,) * 8 + (*FEW_VALUES, math.nan))
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=rule_sets(FEW_THRESHOLDS, stop_one_in=3),
    summaries=scenarios(
        STICKY_POOLS,
        stages=("rollout", "rollout", "actor"),
        runs_choice=(1,),
        min_size=20,
        max_size=80,
        kinds=("new",) * 30 + ("reemit", "revise", "resume", "back", "orphan"),
        missing_one_in=10,
        same_fields=True,
    ),
)
@example(  # a rule blocked by its cooldown keeps counting and fires right after it
    specs=[rule(HIGH, for_steps=2, cooldown_steps=2)], summaries=series([2.0] * 8)
)
@example(  # an enforced stop blocks the later rules of the same evaluation; a dry-run one not
    specs=[
        rule(HIGH, id="dry-stop", dry_run=True, actions=STOP),
        rule(HIGH, id="stop", actions=STOP),
        rule(HIGH, id="after"),
    ],
    summaries=series([2.0, 2.0]),
)
@example(  # re-emitted steps, a first-seen revision 2, a step behind the last: no evaluation
    specs=[rule(HIGH, for_steps=2)],
    summaries=[
        *series([2.0, 2.0]),
        *series([2.0], start=2),
        make_summary("run-a", 1, "actor", 3, {"a": stats_of(2.0)}, revision=2),
        *series([2.0], start=4),
        *series([2.0, 2.0], start=1),
        *series([2.0], start=5),
    ],
)
@example(  # an alias list binds to the first listed name of the first carrier, per attempt
    specs=[rule(HIGH, metric=("a", "b"), for_steps=2)],
    summaries=[
        make_summary("run-a", 1, "actor", 1, {"b": stats_of(2.0), "c": stats_of(2.0)}),
        make_summary("run-a", 1, "actor", 2, {"a": stats_of(2.0)}),  # not bound: no evaluation
        make_summary("run-a", 1, "actor", 3, {"a": stats_of(2.0), "b": stats_of(2.0)}),
        make_summary("run-a", 2, "actor", 1, {"a": stats_of(2.0), "b": stats_of(0.0)}),
        make_summary("run-a", 2, "actor", 2, {"a": stats_of(2.0), "b": stats_of(0.0)}),
    ],
)
def test_control_flow_matches_reference(
    specs: list[RuleSpec], summaries: list[StepSummary]
) -> None:
    check(specs, summaries)


def always(stat: str, window: int) -> list[RuleSpec]:
    """Three rules that together fire at every evaluation with a full window."""
    over = (stat, window)
    return [
        rule(("non_finite",), id="nonfinite", over_steps=over),
        rule(("outside", 0.0, 0.0), id="nonzero", over_steps=over),
        rule(("cmp", "==", 0.0), id="zero", over_steps=over),
    ]


@settings(max_examples=1000, deadline=None)
@given(
    stat=st.sampled_from(STATS),
    window=st.integers(2, 5),
    values=VALUE_POOLS.flatmap(lambda pool: st.lists(pool, min_size=1, max_size=12)),
    gaps=st.lists(st.sampled_from((1, 2, 7, 1000)), min_size=12, max_size=12),
)
# Bugs found (values -> what the evaluator gave / what DESIGN says):
# delta with a NaN inside the window: 1.0 / NaN ("any NaN among the inputs gives NaN")
@example(stat="delta", window=3, values=[1.0, math.nan, 2.0], gaps=[1] * 12)
# var of [d, -d]: squares through libm pow, 1 ulp off d * d / the correctly rounded square
@example(stat="var", window=2, values=[0.13002254942585267, -0.13002254942585267], gaps=[1] * 12)
# squares of huge values: OverflowError / inf (IEEE)
@example(stat="std", window=3, values=[0.0, 0.0, 1e308], gaps=[1] * 12)
@example(stat="zscore", window=3, values=[1e200, -1e200, 0.0], gaps=[1] * 12)
# fsum overflows on a partial sum: inf (naive sum) / 1e308 / 3 (the exact sum is 1e308)
@example(stat="mean", window=3, values=[1e308, 1e308, -1e308], gaps=[1] * 12)
# ... and with an infinity: NaN (naive 1e308 + 1e308 + -inf) / -inf
@example(stat="mean", window=3, values=[1e308, 1e308, -math.inf], gaps=[1] * 12)
# mean of huge values: OverflowError / the exact mean 1e308 (so slope 0, var 0)
@example(stat="slope", window=2, values=[1e308, 1e308], gaps=[1] * 12)
@example(stat="var", window=2, values=[1e308, 1e308], gaps=[1] * 12)
@example(stat="mean", window=3, values=[MAX, MAX, MAX], gaps=[1] * 12)
@example(stat="mean", window=4, values=[1e308, 1e308, math.inf, -math.inf], gaps=[1] * 12)
# slope whose fsum of products overflows though the exact sum is finite
@example(
    stat="slope",
    window=4,
    values=[1e308, 1e308, 1e200, 1e308, MAX, 1e200],
    gaps=[1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1],
)
def test_window_statistics_to_the_bit(
    stat: str, window: int, values: list[float], gaps: list[int]
) -> None:
    window = max(window, 3) if stat == "zscore" else window
    steps, step = [], 0
    for gap in gaps[: len(values)]:
        step += gap
        steps.append(step)
    summaries = [
        make_summary("run-a", 1, "actor", s, {"a": stats_of(v)})
        for s, v in zip(steps, values, strict=True)
    ]
    check(always(stat, window), summaries)
